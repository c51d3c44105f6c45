"""`ssm` group: the SSM state backends."""
from typing import Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("ssm")
class EagerSSM(Component):
    """Today's serving semantics: one state per slot, read and written every decode step."""
    kind: Literal["eager"] = "eager"
    state_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the stored recurrent state (math is fp32 either way)")
    kernel: Literal["auto", "triton", "ref"] = Field(
        "auto", description="auto: Triton on CUDA, torch reference on CPU; triton/ref force one")

    def build(self, ctx):
        from synodic.ssm.eager import EagerStateBackend
        return EagerStateBackend(ctx.model, ctx.max_slots, ctx.device, self, window=ctx.window)


@register("ssm")
class ReplaySSM(Component):
    """ReplaySSM: a checkpoint per slot plus a ring of the last L steps' inputs; the state is written
    only when the ring is full (flush), outputs are replayed from checkpoint + ring."""
    kind: Literal["replay"] = "replay"
    ring_len: int = Field(16, ge=2, le=64, description="L: ring entries; the checkpoint is rewritten every L steps")
    precision: Literal["fp32", "dual_bf16", "dual_fp8", "single_bf16", "single_fp8"] = Field(
        "dual_bf16", description="fp32: fp32 checkpoint; dual_*: fp32 checkpoint for the recurrence plus a "
        "bf16/fp8 copy refreshed at flushes and read for outputs; single_*: one low-precision checkpoint")
    gdn_route: Literal["adjoint", "state"] = Field(
        "adjoint", description="GDN output route: adjoint (query propagated back through the ring) or "
        "state (rebuild the state tile from checkpoint + ring)")
    kernel: Literal["auto", "triton", "ref"] = Field(
        "auto", description="auto: Triton on CUDA, torch reference on CPU; triton/ref force one")

    def build(self, ctx):
        from synodic.ssm.replay import ReplayStateBackend
        return ReplayStateBackend(ctx.model, ctx.max_slots, ctx.device, self)
