"""`python run.py [group=option ...] [key=value ...]`: the same as the `synodic` command (see README)."""
from synodic.cli import main

if __name__ == "__main__":
    main()
