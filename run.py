"""`python run.py [group=option ...] [key=value ...]`: the same as the `synodic` command (see README)."""
from synodic.cli import main

if __name__ == "__main__":
    from synodic.config.hydra_errors import guard
    guard()  # Hydra's own errors, --help: one line each, exit 2
    main()
