"""Plain-torch reference of `rope_norm` (the models' RoPE and QK-norm composition) and the cos / sin tables."""
from __future__ import annotations

import torch

from ..rmsnorm.ref import rmsnorm_ref


def rope_cs(pos: torch.Tensor, theta: float, rot_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., T, 1, rot_dim / 2] of RoPE at positions pos (broadcastable to [..., T])."""
    half = rot_dim // 2
    inv = theta ** (-torch.arange(half, device=pos.device, dtype=torch.float32) / half)
    ang = pos.float()[..., None] * inv  # [..., T, half]
    return ang.cos()[..., None, :], ang.sin()[..., None, :]


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    """Rotate-half RoPE on the first rot dims of x [..., heads, D] (fp32 arithmetic, x.dtype out)."""
    half = rot // 2
    xr, rest = x[..., :rot].float(), x[..., rot:]
    x1, x2 = xr[..., :half], xr[..., half:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return torch.cat([out, rest], dim=-1)


def rope_norm_ref(x, cos, sin, rot: int, weight=None, eps: float = 1e-6) -> torch.Tensor:
    if weight is not None:
        x = rmsnorm_ref(x, weight, eps)
    return rope_ref(x, cos, sin, rot)
