"""Compose a RunConfig from override strings without running a job (tests, bench variants, notebooks)."""
from importlib import resources
from pathlib import Path

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
    finally:
        if outer is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(outer)


def compose_raw(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    from omegaconf import OmegaConf
    raw = OmegaConf.to_container(compose_node(overrides), resolve=False)
    raw.pop("hydra", None)
    return raw


def compose(overrides: list[str] | tuple[str, ...] = ()):
    from .schema import validate
    return validate(compose_raw(overrides))
