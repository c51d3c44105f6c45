"""SmoothQuant: move activation outliers into the weight with a per-input-channel scale.

Paper: X' = X diag(t)^-1, W' = W diag(t), t_j = max|X_j|^a / max|W_j|^(1-a). In our contract the
activation multiplier is s = 1/t, so s_j = max|W_j|^(1-a) / max|X_j|^a and the stored weight is Q(W / s).
"""

from __future__ import annotations

import torch

from synodic.quant.methods.common import Solution, check_weight
from synodic.quant.qtensor import dequantize, quantize

_EPS = 1e-5  # as in the SmoothQuant reference code: keeps dead channels from giving 0 or inf


def smooth_scales(weight: torch.Tensor, act_absmax: torch.Tensor | None = None, alpha: float = 0.5) -> torch.Tensor:
    w_max = weight.abs().amax(0).clamp(min=_EPS)
    x_max = act_absmax.to(weight.device, torch.float32).clamp(min=_EPS)
    return w_max.pow(1 - alpha) / x_max.pow(alpha)


def solve_smoothquant(
    weight: torch.Tensor,
    fmt: str,
    *,
    act_absmax: torch.Tensor | None = None,
    alpha: float = 0.5,
    rule: str = "floor",
) -> Solution:
    """`act_absmax`: per-input-channel max|X_j| from calibration (length K); `alpha` in [0, 1]."""
    w = check_weight(weight)
    if act_absmax is None or act_absmax.shape != (w.shape[1],):
        got = None if act_absmax is None else tuple(act_absmax.shape)
        raise ValueError(f"smoothquant needs act_absmax of shape ({w.shape[1]},) (calibration max|X_j|), got {got}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothquant alpha must be in [0, 1], got {alpha}")
    s = smooth_scales(w, act_absmax, alpha)
    q = quantize(w / s, fmt, rule=rule)
    return Solution(dequantize(q), s, q, {"alpha": alpha})
