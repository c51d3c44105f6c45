"""Rotate-half RoPE over whole heads computed in x's dtype (the drafter's convention; kernels/rope is the
target's, in fp32 with an optional QK-norm):

    y[..., :d/2] = x1 * cos - x2 * sin,   y[..., d/2:] = x2 * cos + x1 * sin,   x1, x2 = the halves of x

x [B, N, heads, d] (d even); cos / sin [B, N, d/2] in x's dtype. Each product and sum rounds to x's dtype (the
reference and the interpreter; compiled, a product and sum may contract to one FMA, about one ulp apart).
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import rope_dtype_ref

__all__ = ["rope_dtype", "rope_dtype_ref"]


def rope_dtype(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring; returns [B, N, heads, d] in x.dtype. No autograd."""
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"rope_dtype: x: expected shape [B, N, heads, d] with d even, got {tuple(x.shape)}")
    B, N, _, D = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (B, N, D // 2) or t.dtype != x.dtype:
            raise ValueError(f"rope_dtype: {name}: expected {x.dtype} {(B, N, D // 2)}, got {t.dtype} "
                             f"{tuple(t.shape)}")
    if pick_backend(backend, x) == "ref":
        return rope_dtype_ref(x, cos, sin)
    from .triton_impl import rope_dtype_triton

    return rope_dtype_triton(x, cos, sin)
