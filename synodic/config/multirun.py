"""`-m` / `--multirun`: every job of a Hydra sweep composed and validated before the first one starts, so a
bad combination fails the whole sweep at once, one line per bad job."""
import itertools

from .compose import CONF_DIR

_SWEEPS = "a comma list (a,b), choice(a,b), range(start,stop[,step]) or, for a config group, glob(pattern)"


def jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of each job of Hydra's basic sweeper: the product of the comma-separated sweeps.
    A sweep Hydra cannot parse or enumerate is a ConfigError, one line naming the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException

    from .errors import ConfigError
    from .hydra_errors import format_hydra_error, options
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(format_hydra_error(e, overrides)) from None
    axes = []
    for o in parsed:
        if not o.is_sweep_override():
            axes.append([o.input_line])
            continue
        key, group = o.get_key_element(), o.key_or_group
        if isinstance(o.value(), Glob):  # Hydra's sweeper asks its config loader for a group's options
            if (CONF_DIR / group).is_dir():
                vals = o.value().filter(options(group))
            else:
                raise ConfigError([f"{o.input_line!r}: glob() sweeps the options of a config group, {group} is "
                                   f"not one; expected {_SWEEPS}"])
        else:
            try:
                vals = list(o.sweep_string_iterator())
            except HydraException as e:  # interval(): continuous, nothing to enumerate
                raise ConfigError([f"{o.input_line!r}: {str(e).strip()}; expected {_SWEEPS}"]) from None
        if not vals:
            raise ConfigError([f"{o.input_line!r}: the sweep has no values; expected {_SWEEPS}"])
        axes.append([f"{key}={v}" for v in vals])
    return [list(combo) for combo in itertools.product(*axes)]


def check_multirun(argv: list[str]) -> None:
    """Raises ConfigError naming each job that would fail validation (argv: the command line's overrides)."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    from .hydra_errors import split_argv
    overrides = split_argv(argv)[0]  # the job's overrides: not Hydra's flags nor hydra/... and hydra.... keys
    from synodic.distributed.sweep import validate_trials
    validate_trials(jobs(overrides), "multirun", noun="job")
