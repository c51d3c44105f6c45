"""Compose a RunConfig from override strings without running a job (tests, bench variants, notebooks)."""
import errno
from importlib import resources
from pathlib import Path

from .errors import ConfigError, _short

# The config groups ship inside the package (`synodic.conf`, mapped from the checkout's conf/).
CONF_DIR = Path(str(resources.files("synodic.conf")))


def compose_node(overrides: list[str] | tuple[str, ...] = (), hydra: bool = False):
    """The composed DictConfig from Hydra's compose API (hydra=True: with Hydra's own config, which takes
    hydra/... and hydra.... overrides). Inside a running Hydra job (bench variants, sweeps) Hydra is already
    initialised: its state is set aside and restored."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    gh = GlobalHydra.instance()
    outer = gh.hydra if gh.is_initialized() else None
    gh.clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)
    except OSError as e:  # Hydra looks a key or option up as a file: a name past the file system's limit
        if e.errno != errno.ENAMETOOLONG:
            raise
        raise ConfigError([_too_long(list(overrides))]) from None
    finally:
        if outer is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(outer)


def _too_long(overrides: list[str]) -> str:
    """The longest override is the one whose name the file system refused: an unknown key or option."""
    o = max(overrides, key=len, default="")
    key, _, val = o.lstrip("+~").partition("=")
    if key in {d.name for d in CONF_DIR.iterdir() if d.is_dir()}:  # never stat the long name itself
        from .hydra_errors import options
        return f"{key}={_short(val, 40)}: unknown option ({len(val)} characters); expected one of " \
               f"{', '.join(options(key))}"
    from .hydra_errors import _fields
    from .registry import GROUPS
    group = key.split(".")[0]
    known = _fields(group, overrides) if group in GROUPS else ""
    name = key if len(key) <= 40 else key[:37] + "..."
    return f"{name}: unknown key ({len(key)} characters); expected " + \
        (f"one of {known}" if known else "a key of the config (python run.py --help lists them)")


def compose_raw(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    from omegaconf import OmegaConf
    raw = OmegaConf.to_container(compose_node(overrides), resolve=False)
    raw.pop("hydra", None)
    return raw


def compose(overrides: list[str] | tuple[str, ...] = ()):
    from .schema import validate
    return validate(compose_raw(overrides))
