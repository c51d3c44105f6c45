"""x * s with s one fp32 factor per input channel (DualQuant's activation multiplier on a quantized linear's dense
path), in x's dtype, rounded once from the fp32 product: the bits of (x.float() * s).to(x.dtype).

torch's mixed-dtype multiply (bf16 x, fp32 s, bf16 out) runs its dynamic-cast elementwise kernel, about 3x the
copy time of x; this kernel is one vectorised pass. x [..., K] (rows may be strided), s [K] fp32.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import row_scale_ref

__all__ = ["row_scale", "row_scale_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def row_scale(x: torch.Tensor, s: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """x * s in x's dtype (see the module docstring). Returns x's shape, contiguous. No autograd."""
    if x.dim() < 1 or x.dtype not in _DTYPES:
        raise ValueError(f"x: expected a float32 / bfloat16 / float16 tensor [..., K], got {x.dtype} {tuple(x.shape)}")
    expect_shape("s", s, (x.shape[-1],), "[K], K = x's last dim")
    if s.dtype != torch.float32 or s.device != x.device:
        raise ValueError(f"s: expected float32 on {x.device}, got {s.dtype} on {s.device}")
    if pick_backend(backend, x) == "ref":
        return row_scale_ref(x, s)
    from .triton_impl import row_scale_triton

    return row_scale_triton(x, s)
