"""Compose a RunConfig from override strings without running a job (tests, bench variants, notebooks)."""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_raw(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    raw = OmegaConf.to_container(cfg, resolve=False)
    raw.pop("hydra", None)
    return raw


def compose(overrides: list[str] | tuple[str, ...] = ()):
    from .schema import validate
    return validate(compose_raw(overrides))
