"""Weight quantization methods. Each returns a Solution (w_q, s, q, info); see common.Solution."""

from __future__ import annotations

import torch

from synodic.quant.formats import get_format
from synodic.quant.methods.common import Solution
from synodic.quant.methods.dualquant import solve_dualquant
from synodic.quant.methods.rtn import solve_rtn
from synodic.quant.methods.smoothquant import smooth_scales, solve_smoothquant

METHODS = {"rtn": solve_rtn, "smoothquant": solve_smoothquant, "dualquant": solve_dualquant}


def solve_full(weight: torch.Tensor, fmt: str, method: str = "rtn", **opts) -> Solution:
    get_format(fmt)  # unknown format -> ValueError before any work
    if method not in METHODS:
        raise ValueError(f"unknown quant method {method!r}; expected one of: {', '.join(METHODS)}")
    return METHODS[method](weight, fmt, **opts)


def solve(weight: torch.Tensor, fmt: str, method: str = "rtn", **opts) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantize a 2-D weight W (N x K) -> (w_q, s), s a length-K activation multiplier or None, with
    fake_quant(x * s, fmt) @ w_q.T ~= x @ W.T (effective weight w_q * s; w_q = dequant(Q(W / s)))."""
    sol = solve_full(weight, fmt, method, **opts)
    return sol.w_q, sol.s


__all__ = ["METHODS", "Solution", "smooth_scales", "solve", "solve_full"]
