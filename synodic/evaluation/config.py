"""`pipeline=eval`: held-out bits per byte / perplexity, and optionally a teacher-forced comparison of
the run's config against a reference config (the same run with some groups replaced)."""
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from synodic.config.registry import GROUPS, Component, register
from synodic.quant.config import MODES


@register("pipeline")
class EvalPipeline(Component):
    """Score the run's model (with its quant scheme) on held-out text; compare it with `reference`."""
    kind: Literal["eval"] = "eval"
    text: str | None = Field(None, description="text file to score; null: the shipped held-out shard "
                             "(synodic/assets/corpus/heldout.txt, identical on every machine)")
    seq_len: int = Field(2048, ge=16, description="tokens per scored window (each from an empty state)")
    batch_size: int = Field(4, ge=1, description="windows per forward pass")
    max_tokens: int | None = Field(None, ge=16, description="score only the first this many tokens "
                                   "(null: the whole text)")
    path: Literal["forward", "decode"] = Field(
        "forward", description="forward: whole-window forward passes (fast; SSM backends and KV "
        "policies are not exercised); decode: teacher-forced token-by-token decode steps through "
        "the state backend and KV policy (use to compare ssm or kv options)")
    # before quant_grid: the grid's validator checks each entry with this mode
    quant_mode: Literal[tuple(MODES)] | None = Field(  # type: ignore[valid-type]
        None, description="quant.mode for every quant_grid entry (e.g. w4a4); null: each format's weight-only mode")
    quant_grid: list[str] = Field(default_factory=list, description="'format:method' pairs (e.g. "
                                  "mxfp4:rtn, mxfp4:dualquant) each compared with the run's unquantized "
                                  "model: KL, top-1, perplexity, per-layer weight error; table + plots")
    decay_scale: float = Field(1.0, gt=0, le=1, description="multiplies every SSM layer's decay rate "
                               "(A = -exp(A_log)) in the scored and the reference model alike: a longer state "
                               "memory than the weights have, to study how precision errors accumulate")
    reference: dict[str, Any] | None = Field(None, description="groups replaced to make the reference "
                                             "config, e.g. {quant: {kind: none}} or {model: {dtype: "
                                             "float32}}; null: no comparison")

    @field_validator("text")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        from synodic.config.files import text_problem
        why = None if v is None else text_problem(v)
        if why:
            raise ValueError(why)
        return v

    @field_validator("quant_grid")
    @classmethod
    def _grid(cls, v: list[str], info) -> list[str]:
        from synodic.config.files import quant_grid_problems
        bad = quant_grid_problems(v, info.data.get("quant_mode"))
        if bad:
            raise ValueError("; ".join(bad))
        return v

    @field_validator("reference")
    @classmethod
    def _groups(cls, v: dict | None) -> dict | None:
        if v is None:
            return v
        bad = [k for k in v if k not in GROUPS or k == "pipeline"]
        if bad:
            raise ValueError(f"unknown groups {bad}; expected keys from "
                             f"{', '.join(g for g in GROUPS if g != 'pipeline')}")
        if any(not isinstance(o, dict) for o in v.values()):
            raise ValueError("expected {group: {field: value, ...}}")
        return v

    @model_validator(mode="after")
    def _long_windows(self):
        if (self.reference or self.quant_grid) and self.seq_len < 2048:
            raise ValueError(f"pipeline.seq_len={self.seq_len} with a reference: expected >= 2048 "
                             "(comparisons are made over sequences of at least 2048 tokens)")
        return self
