"""Per-group registries. A component is a pydantic class whose `kind` Literal is its registration key;
the union of a group's classes is that group's schema — nothing else lists them."""
from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

GROUPS = ("model", "ssm", "kv", "spec", "quant", "workload", "runtime", "pipeline")


class Component(BaseModel):
    """Base of every config option: frozen, unknown keys rejected, every field documented."""
    # inf / nan are never a setting (booleans given for numbers: schema.bool_for_number).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def build(self, ctx: Any) -> Any:  # pragma: no cover - overridden where a group builds something
        raise NotImplementedError(f"{type(self).__name__} builds nothing")


class Registry:
    def __init__(self, group: str):
        self.group = group
        self.classes: dict[str, type[Component]] = {}

    def register(self, cls: type[Component]) -> type[Component]:
        ann = cls.model_fields["kind"].annotation
        for kind in get_args(ann) if getattr(ann, "__origin__", None) is Literal else ():
            if kind in self.classes:
                raise ValueError(f"{self.group}: kind {kind!r} registered twice")
            self.classes[kind] = cls
        for name, f in cls.model_fields.items():
            if name != "kind" and not f.description:
                raise TypeError(f"{cls.__name__}.{name}: every config field needs a description")
        return cls

    def kinds(self) -> list[str]:
        return sorted(self.classes)

    def schema(self):
        members = list(dict.fromkeys(self.classes.values()))
        if len(members) == 1:
            return members[0]
        return Annotated[functools.reduce(operator.or_, members), Field(discriminator="kind")]


REGISTRIES = {g: Registry(g) for g in GROUPS}


def register(group: str):
    return REGISTRIES[group].register


def numeric_bool_problems(group: str, cls: type[Component], values: dict) -> list[str]:
    """A bool where a number is meant (`max_slots=true`) is a slip, not 1; pydantic would take it."""
    out = []
    for name, v in values.items():
        f = cls.model_fields.get(name)
        if f is None or not isinstance(v, bool):
            continue
        args = set(get_args(f.annotation)) or {f.annotation}
        if args & {int, float} and bool not in args:
            out.append(f"{group}.{name}={str(v).lower()}: expected a number, not a boolean")
    return out


SEED_LIMIT = 2 ** 63  # torch.Generator.manual_seed takes a 64-bit value; request i's seed is seed + i


def seed_problems(values, prefix: str = "") -> list[str]:
    """Every seed (`seed`, `*_seed`) at any depth of a raw config, out of [0, 2**63): torch overflows on it
    otherwise, mid-run."""
    out = []
    for name, v in (values.items() if isinstance(values, dict) else ()):
        key = f"{prefix}{name}"
        if isinstance(v, dict):
            out += seed_problems(v, f"{key}.")
        elif (name == "seed" or str(name).endswith("_seed")) and isinstance(v, int) and not isinstance(v, bool) \
                and not 0 <= v < SEED_LIMIT:
            out.append(f"{key}={v}: expected an integer seed in [0, 2**63)")
    return out
