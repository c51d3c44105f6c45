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
        return EagerStateBackend(ctx.model, ctx.max_slots, ctx.device, self)
