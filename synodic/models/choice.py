"""`model` group: which architecture preset and which weights."""
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from synodic.config.registry import Component, register

from .config import HybridConfig
from .presets import PRESETS


@register("model")
class ModelChoice(Component):
    kind: Literal[tuple(PRESETS)]  # type: ignore[valid-type]
    weights: str = Field("auto", description="auto: the shipped trained checkpoint if there is one, "
                         "else random; random: seeded random init; or a checkpoint directory")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    seed: int = Field(0, description="seed of the random init")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="HybridConfig fields replacing the preset's")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: str) -> str:
        if v not in ("auto", "random"):
            from synodic.config.files import checkpoint_problems
            problems = checkpoint_problems(v)
            if problems:
                raise ValueError("; ".join(problems))
        return v

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, v: dict, info) -> dict:
        unknown = sorted(set(v) - set(HybridConfig.model_fields))
        if unknown:
            raise ValueError(f"unknown HybridConfig field(s) {unknown}; expected fields of "
                             "synodic/models/config.py such as hidden_size, num_hidden_layers")
        kind = info.data.get("kind")
        if kind in PRESETS:
            try:
                HybridConfig.model_validate({**PRESETS[kind].model_dump(), **v})
            except ValidationError as e:
                raise ValueError("; ".join((f"{'.'.join(map(str, x['loc']))}: " if x["loc"] else "") +
                                           x["msg"].removeprefix("Value error, ") for x in e.errors())) from None
        return v

    def architecture(self) -> HybridConfig:
        base = PRESETS[self.kind]
        if self.weights not in ("auto", "random"):
            from .weights import load_config
            base = load_config(self.weights)
        elif self.weights == "auto":
            from .weights import load_config, shipped_dir
            d = shipped_dir(self.kind)
            if d and self.overrides:
                from synodic.config.files import note
                note(f"model.overrides={dict(self.overrides)} with model.weights=auto: the shipped {self.kind} "
                     f"checkpoint does not match; using seeded random weights")
            base = load_config(d) if d and not self.overrides else base
        return HybridConfig.model_validate({**base.model_dump(), **self.overrides})
