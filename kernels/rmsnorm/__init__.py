"""RMSNorm over the last dim and the gated, grouped RMSNorm of the Mamba-2 / GDN outputs
(synodic/models/norm.py semantics, fp32 statistics):

    rmsnorm:        y = x * rsqrt(mean(x², -1) + eps) * weight
    add_rmsnorm:    s = x + r (rounded to x.dtype, returned), y = rmsnorm(s)   (a residual add fused in)
    gated_rmsnorm:  h = x * silu(z);  y = h * rsqrt(mean(h², group) + eps) * weight   (per group of
                    `group_size` channels)
Output in x.dtype. Any leading dims; the last dim may sit in a row-strided view (e.g. a slice of a
projection's output).
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import add_rmsnorm_ref, gated_rmsnorm_ref, rmsnorm_ref

__all__ = ["rmsnorm", "add_rmsnorm", "gated_rmsnorm", "rmsnorm_ref", "add_rmsnorm_ref", "gated_rmsnorm_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x, z, weight, group_size) -> int:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x: expected shape [..., D] with D > 0, got {tuple(x.shape)}")
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight: expected shape [D] = ({D},), got {tuple(weight.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z: expected x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    gs = D if group_size is None else group_size
    if gs <= 0 or D % gs:
        raise ValueError(f"group_size: expected a divisor of D={D}, got {group_size}")
    for name, t in (("x", x), ("z", z), ("weight", weight)):
        if t is None:
            continue
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: expected dtype float32, bfloat16 or float16, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    return gs


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, *, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of x [..., D] with weight [D]; returns x.dtype.
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref". No autograd."""
    _check(x, None, weight, None)
    if pick_backend(backend, x) == "ref":
        return rmsnorm_ref(x, weight, eps)
    from .triton_impl import rmsnorm_triton

    return rmsnorm_triton(x, None, weight, eps, x.shape[-1])


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, *,
                backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rmsnorm(s)) with s = x + residual in x.dtype: a pre-norm block's residual add and the next norm in one
    pass (one read of each input, two writes). residual: x's shape and dtype. backend as `rmsnorm`."""
    _check(x, None, weight, None)
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"residual: expected x's shape, dtype and device ({tuple(x.shape)}, {x.dtype}, {x.device}), "
                         f"got ({tuple(residual.shape)}, {residual.dtype}, {residual.device})")
    if pick_backend(backend, x) == "ref":
        return add_rmsnorm_ref(x, residual, weight, eps)
    from .triton_impl import rmsnorm_triton

    return rmsnorm_triton(x, None, weight, eps, x.shape[-1], residual=residual)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
                  group_size: int | None = None, *, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of x * silu(z) per group of `group_size` (default D) channels; x, z [..., D], weight
    [D]; returns x.dtype. backend: "auto" | "triton" | "ref". No autograd."""
    gs = _check(x, z, weight, group_size)
    if pick_backend(backend, x) == "ref":
        return gated_rmsnorm_ref(x, z, weight, eps, gs)
    from .triton_impl import rmsnorm_triton

    return rmsnorm_triton(x, z, weight, eps, gs)
