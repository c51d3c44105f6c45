"""Plain-torch references of `rmsnorm` / `gated_rmsnorm`: the computations of synodic/models/norm.py
as they were before the fused kernel (the modules' CPU and autograd path)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def gated_rmsnorm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                      group_size: int) -> torch.Tensor:
    h = x.float() * F.silu(z.float())
    shape = h.shape
    h = h.reshape(*shape[:-1], -1, group_size)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.reshape(shape) * weight.float()).to(x.dtype)


def add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return s, rmsnorm_ref(s, weight, eps)
