"""What every method returns, and the checks they share."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from synodic.quant.qtensor import QTensor


@dataclass
class Solution:
    """A solved weight. Contract: fake_quant(x * s, fmt) @ w_q.T ~= x @ W.T, i.e. the effective weight
    is w_q * s (column j scaled by s_j) and w_q = dequantize(q) with q = Q(W / s), the stored weight.
    s is None when activations are used as they are (RTN)."""

    w_q: torch.Tensor
    s: torch.Tensor | None
    q: QTensor
    info: dict = field(default_factory=dict)

    def effective_weight(self) -> torch.Tensor:
        return self.w_q if self.s is None else self.w_q * self.s


def check_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N x K), got shape {tuple(weight.shape)}")
    return weight.detach().to(torch.float32)
