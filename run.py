"""synodic entry point: `python run.py [group=option ...] [key=value ...]` (see README)."""
import sys

import hydra


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg) -> None:
    from synodic.cli import execute
    code = execute(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    from synodic.config.hydra_errors import guard
    guard()  # Hydra's own errors, --help: one line each, exit 2
    main()
