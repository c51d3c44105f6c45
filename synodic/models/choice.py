"""`model` group: which architecture preset and which weights."""
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

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

    @model_validator(mode="after")
    def _bytes_fit(self):
        """Without a tokenizer.json, text is encoded as raw UTF-8 bytes (synodic/engine/text.py ByteCodec): ids
        up to 255 must be rows of the embedding, or decode fails mid-run. A tokenizer.json larger than the
        vocabulary is the weights validator's to report (files.py, models/hf)."""
        from synodic.graph import checkpoint_dir
        ckpt = checkpoint_dir(self)
        if ckpt is not None and (ckpt / "tokenizer.json").is_file():
            return self
        from .weights import load_config
        vocab = (load_config(ckpt) if ckpt is not None else self.architecture()).vocab_size
        if vocab < 256:
            key = (f"model.overrides.vocab_size={vocab}" if "vocab_size" in self.overrides and ckpt is None
                   else f"model.weights={self.weights!r}: config.json's vocab_size={vocab}")
            raise ValueError(f"{key} without a tokenizer.json: expected vocab_size >= 256 (text is then encoded "
                             "as raw UTF-8 bytes, ids 0-255), or a checkpoint with a tokenizer that fits")
        return self

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
