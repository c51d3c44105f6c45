"""`-m` / `--multirun`: every job of a Hydra sweep composed and validated before the first one starts, so a
bad combination fails the whole sweep at once, one line per bad job."""
import itertools


def jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of each job of Hydra's basic sweeper: the product of the comma-separated sweeps."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for o in parsed:
        if o.is_sweep_override():
            axes.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(combo) for combo in itertools.product(*axes)]


def check_multirun(argv: list[str]) -> None:
    """Raises ConfigError naming each job that would fail validation (argv: the command line's overrides)."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    overrides = [a for a in argv if not a.startswith("-") and "=" in a and not a.startswith("hydra.")]
    from synodic.distributed.sweep import validate_trials
    validate_trials(jobs(overrides), "multirun", noun="job")
