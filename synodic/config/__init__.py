"""Config graph: per-group registries, the RunConfig schema, one-line errors, the config hash."""
from .errors import ConfigError
from .registry import GROUPS, REGISTRIES, Component, register
from .schema import config_hash, run_config_class, validate

__all__ = [
           "GROUPS",
           "REGISTRIES",
           "Component",
           "ConfigError",
           "config_hash",
           "register",
           "run_config_class",
           "validate",
]
