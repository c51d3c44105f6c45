"""RTN: the plain cast of the weight (round to nearest, format's own scale rule)."""

from __future__ import annotations

import torch

from synodic.quant.methods.common import Solution, check_weight
from synodic.quant.qtensor import dequantize, quantize


def solve_rtn(weight: torch.Tensor, fmt: str, *, rule: str = "floor") -> Solution:
    """`rule`: MX scale rule (floor | rceil | rceil_exact); ignored by nvfp4 / int4_g64."""
    q = quantize(check_weight(weight), fmt, rule=rule)
    return Solution(dequantize(q), None, q)
