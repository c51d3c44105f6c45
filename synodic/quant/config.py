"""`quant` group: post-training quantization schemes for the model's linears."""

from typing import Literal

from synodic.config.registry import Component, register


@register("quant")
class NoQuant(Component):
    """Weights and activations in the model dtype."""

    kind: Literal["none"] = "none"

    def build(self, ctx):
        return None
