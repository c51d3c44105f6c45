"""`spec` group: speculative decoding schemes (draft models plug in here)."""
from typing import Literal

from synodic.config.registry import Component, register


@register("spec")
class NoSpec(Component):
    """Plain autoregressive decoding: one token per sequence per step."""
    kind: Literal["none"] = "none"

    def build(self, ctx):
        return None
