"""`spec` group: speculative decoding schemes. Each option's `build(ctx)` returns the drafter runtime the
Engine drives (synodic/spec/runtime.py); `window` (1 + drafts) sizes the state backend's and the KV policy's
verify reservations through the graph (synodic/graph.py)."""
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from synodic.config.errors import ConfigError
from synodic.config.registry import Component, register

_GAMMA = "γ: draft tokens proposed per step (the verify window is 1 + γ tokens)"
_GATE = ("auto: greedy batches draft only where drafting steps beat plain decode steps (load-aware DSpark prices "
         "both by its SPS profile, every other drafter by the step times it measures per batch bucket), running "
         "plain steps otherwise and drafting again only to re-measure (synodic/spec/gate.py); off: every step drafts")
_MAX_WAIT = ("most plain steps a closed gate runs between two probes (drafting steps that re-measure); a losing "
             "probe doubles the wait up to this. Each probe costs a synced drafting step and a break in the "
             "overlapped plain chain, so fewer probes lose less where drafts cannot pay, and a closed batch "
             "notices later when they can again")
_MAX_BATCH = ("speculate only in steps of at most this many rows; a larger batch runs plain decode steps (its "
              "verify window would cost more than the drafts earn: docs/speculative.md); null: always speculate")


@register("spec")
class NoSpec(Component):
    """Plain autoregressive decoding: one token per sequence per step."""
    kind: Literal["none"] = "none"

    @property
    def window(self) -> int:
        return 1

    def build(self, ctx):
        return None


@register("spec")
class NgramSpec(Component):
    """Prompt lookup: the longest suffix of the context (max_ngram down to min_ngram tokens) that occurred
    before proposes the tokens that followed its latest earlier occurrence. No weights; runs on the host's
    token lists (a numpy scan of the context per row and step, microseconds at the embedded lengths).
    γ defaults to 4: on the embedded targets 3-5 decode fastest and 7 is 14-17 % slower at batch 1 (its longer
    window costs more than the ~0.3 extra tokens a step it accepts; BENCHMARKS.md S2)."""
    kind: Literal["ngram"] = "ngram"
    num_speculative_tokens: int = Field(4, ge=1, description=_GAMMA)
    max_ngram: int = Field(4, ge=1, description="longest suffix matched against the earlier context")
    min_ngram: int = Field(1, ge=1, description="shortest suffix matched; no match of any length = no drafts "
                           "for that row this step (a one-token verify)")
    max_batch: int | None = Field(None, ge=1, description=_MAX_BATCH)
    gate: Literal["auto", "off"] = Field("auto", description=_GATE)
    gate_max_wait: int = Field(1024, ge=1, description=_MAX_WAIT)

    @model_validator(mode="after")
    def _order(self):
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"spec.min_ngram={self.min_ngram} with spec.max_ngram={self.max_ngram}: expected "
                             "spec.min_ngram <= spec.max_ngram")
        return self

    @property
    def window(self) -> int:
        return 1 + self.num_speculative_tokens

    def build(self, ctx):
        from .gate import MeasuredGate
        from .ngram import NgramDrafter
        return NgramDrafter(self.num_speculative_tokens, self.max_ngram, self.min_ngram,
                            MeasuredGate(max_wait=self.gate_max_wait) if self.gate == "auto" else None)


class _NeuralSpec(Component):
    num_speculative_tokens: int = Field(7, ge=1, description=_GAMMA + "; at most the drafter's trained block")
    drafter: str = Field("auto", description="auto: the drafter shipped for the model (synodic/assets/drafters/"
                         "<model>/<scheme>/); random: seeded random weights (losslessness tests, real-shape "
                         "timing); otherwise a directory written by pipeline=train_drafter")
    seed: int = Field(0, description="seed of drafter=random's weights and of the drafts' sampling")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="drafter weights and context "
                                                          "ring dtype; auto: bfloat16 on a GPU (its latency-"
                                                          "bound small GEMMs run up to 10x faster than fp32 at "
                                                          "the same acceptance), the target's on a CPU")
    context_window: int = Field(1024, ge=1, description="target positions kept in the drafter's context K/V "
                                "ring per request (device memory independent of context length)")
    max_batch: int | None = Field(None, ge=1, description=_MAX_BATCH)
    gate: Literal["auto", "off"] = Field("auto", description=_GATE)
    gate_max_wait: int = Field(1024, ge=1, description=_MAX_WAIT)
    gate_feed: int = Field(64, ge=1, description="while the gate keeps a batch on plain steps, how many plain "
                           "steps before each probe hand the drafter their features (the others run as exact "
                           "plain steps, and the probe's context skips their positions); gate_max_wait + 1 or "
                           "more feeds every one")

    @property
    def window(self) -> int:
        return 1 + self.num_speculative_tokens

    @field_validator("drafter")
    @classmethod
    def _drafter_dir(cls, v: str) -> str:
        """A drafter directory's own files are checked with the config; its fit to the target when the graph is
        built (`directory`, before the target loads)."""
        if v not in ("auto", "random"):
            try:
                from synodic.spec.models import drafter_config
            except ImportError:  # no draft models in this build: `_models` says so when the graph is built
                return v
            drafter_config(v)
        return v

    def _models(self):
        try:
            from synodic.spec import models
        except ImportError:
            raise ConfigError([f"spec={self.kind}: the draft models (synodic.spec.models) are not in this build; "
                               "expected spec=none or spec=ngram"]) from None
        return models

    def directory(self, model_kind: str, target_cfg=None) -> Path | None:
        """The drafter directory this option loads (None for drafter=random); one-line errors when there is
        none, or when it was trained for another target than `target_cfg` (the target's HybridConfig, when given).
        Called by the graph before the target loads, so a bad drafter fails before any long work."""
        if self.drafter == "random":
            self._models()
            return None
        dm = self._models()
        directory = dm.shipped_drafter_dir(model_kind, self.kind) if self.drafter == "auto" else Path(self.drafter)
        if directory is None:
            have = dm.shipped_drafters()
            raise ConfigError([f"spec.drafter='auto': no shipped {self.kind} drafter for model={model_kind}; "
                               f"expected spec.drafter=random or a directory (shipped: {', '.join(have) or 'none'})"])
        from synodic.config.files import lookup_problem, shown
        bad = lookup_problem(directory) or (None if directory.is_dir() else "no such directory")
        if bad:
            raise ConfigError([f"spec.drafter={shown(self.drafter)!r}: {bad}; expected auto, random or a directory "
                               "written by pipeline=train_drafter"])
        cfg = dm.check_drafter_dir(directory)  # its files against its config.json
        if target_cfg is not None:
            dm.check_fit(cfg, target_cfg, directory, model_kind)
        return directory

    def build(self, ctx):
        import torch

        from synodic.graph import DTYPES
        dm = self._models()

        from .runtime import NeuralDrafter
        target_cfg = ctx.model.config
        dtype = DTYPES[self.dtype] if self.dtype != "auto" else (
            torch.bfloat16 if torch.device(ctx.device).type == "cuda" else next(ctx.model.parameters()).dtype)
        if self.drafter == "random":
            model = dm.build_draft_model(self.kind, target_cfg, seed=self.seed, target_kind=ctx.model_kind,
                                         gamma=max(7, self.num_speculative_tokens)).to(ctx.device, dtype)
        else:
            model = dm.load_draft_model(self.directory(ctx.model_kind), target_cfg, ctx.device, dtype)
        if model.scheme != self.kind:
            raise ConfigError([f"spec.drafter='{self.drafter}': a {model.scheme} drafter; expected a {self.kind} "
                               f"drafter for spec={self.kind}"])
        if self.num_speculative_tokens > model.gamma:
            raise ConfigError([f"spec.num_speculative_tokens={self.num_speculative_tokens} with a drafter trained "
                               f"for blocks of {model.gamma} drafts: expected spec.num_speculative_tokens <= "
                               f"{model.gamma}"])
        model.bind_target(ctx.model)
        model.eval()
        # a ring longer than any sequence the graph serves holds nothing more: size it to the shorter, since a step's
        # ring attention reads every row of it (the rows past a request's context are masked, not skipped)
        model.allocate(ctx.max_slots, min(self.context_window, ctx.max_seq_len), ctx.device, dtype)
        return NeuralDrafter(model, self, ctx.device)


@register("spec")
class DFlashSpec(_NeuralSpec):
    """DFlash: a block-diffusion drafter (a few decoder layers on the target's embedding and LM head, the
    target's hidden states as extra K/V rows); one forward proposes the whole block."""
    kind: Literal["dflash"] = "dflash"


@register("spec")
class DSparkSpec(_NeuralSpec):
    """DSpark: the DFlash backbone + a Markov head (exact left-to-right q) + a calibrated confidence head."""
    kind: Literal["dspark"] = "dspark"
    verify: Literal["fixed", "load_aware"] = Field("fixed", description="fixed: verify all num_speculative_tokens "
                                                   "drafts every step; load_aware: per row, as many as the "
                                                   "calibrated confidences and the SPS profile pay for "
                                                   "(synodic/spec/load_aware.py)")

    def build(self, ctx):
        drafter = super().build(ctx)
        if self.verify == "load_aware":
            from .load_aware import find_profile
            drafter.sps = find_profile(ctx.model_kind, ctx.device)
        return drafter


@register("spec")
class DFlash2Spec(_NeuralSpec):
    """DFlash2: the backbone + two-tap dynamic causal convolutions + a top-K path selector."""
    kind: Literal["dflash2"] = "dflash2"
