"""RMSNorm and the gated RMSNorm of Mamba-2 / GDN outputs (fused kernels of synodic.kernels.rmsnorm:
Triton on CUDA, the torch reference on the CPU and whenever autograd records)."""
import torch
import torch.nn.functional as F
from torch import nn

from synodic.kernels.rmsnorm import add_rmsnorm, gated_rmsnorm, rmsnorm


def fused_backend(*ts: torch.Tensor) -> str:
    """Kernel backend of the models' fused ops, which have no backward: the torch reference whenever
    autograd records through one of `ts`, else auto (Triton on CUDA)."""
    return "ref" if torch.is_grad_enabled() and any(t.requires_grad for t in ts) else "auto"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps, backend=fused_backend(x, self.weight))

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it) in one kernel: a pre-norm stack's residual add and next norm."""
        return add_rmsnorm(x, residual, self.weight, self.eps, backend=fused_backend(x, residual, self.weight))


class GatedRMSNorm(RMSNorm):
    """norm(y * silu(z)) per group of `group_size` channels (Mamba-2 normalises per group); with
    `norm_before_gate`, norm(y) * silu(z) (Qwen3-Next's GDN), in plain torch with its rounding points."""

    def __init__(self, dim: int, eps: float = 1e-5, group_size: int | None = None, norm_before_gate: bool = False):
        super().__init__(dim, eps)
        self.group_size = group_size or dim
        self.norm_before_gate = norm_before_gate

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.norm_before_gate:
            h = y.float().unflatten(-1, (-1, self.group_size))
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
            return (self.weight * h.to(y.dtype) * F.silu(z.float())).to(y.dtype)
        return gated_rmsnorm(y, z, self.weight, self.eps, self.group_size, backend=fused_backend(y, z, self.weight))
