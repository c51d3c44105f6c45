"""RMSNorm and the gated RMSNorm of Mamba-2 / GDN outputs."""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class GatedRMSNorm(RMSNorm):
    """norm(y * silu(z)) per group of `group_size` channels (Mamba-2 normalises per group)."""

    def __init__(self, dim: int, eps: float = 1e-5, group_size: int | None = None):
        super().__init__(dim, eps)
        self.group_size = group_size or dim

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = y.float() * F.silu(z.float())
        shape = h.shape
        h = h.reshape(*shape[:-1], -1, self.group_size)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h.reshape(shape) * self.weight.float()).to(y.dtype)
