"""Rotate-half RoPE on the first `rot` dims of each head, optionally after a per-head RMSNorm (QK-norm), as one
kernel per tensor (the torch composition is ~10 small launches per tensor and step):

    h = rmsnorm(x, weight) (in x.dtype)  if weight is given, else x
    y[d]        = h[d] cos[d] - h[d + rot/2] sin[d]                    d < rot / 2
    y[d]        = h[d] cos[d - rot/2] + h[d - rot/2] sin[d - rot/2]    rot / 2 <= d < rot
    y[d]        = h[d]                                                 d >= rot
x [..., H, D] (last dim contiguous); cos / sin fp32, broadcastable to [..., 1, rot / 2] (`rope_cs`'s shape).
Output in x.dtype; Triton computes in fp32 and rounds where the torch path rounds (the norm's output, y).
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import rope_cs, rope_norm_ref, rope_ref

__all__ = ["rope_norm", "rope_norm_ref", "rope_ref", "rope_cs"]


def rope_norm(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, weight: torch.Tensor | None = None,
              eps: float = 1e-6, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring. No autograd."""
    if x.dim() < 2 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x: expected a float32 / bfloat16 / float16 tensor [..., H, D], "
                         f"got {x.dtype} {tuple(x.shape)}")
    D = x.shape[-1]
    if rot % 2 or not 0 < rot <= D:
        raise ValueError(f"rot: expected an even number in (0, D = {D}], got {rot}")
    half = rot // 2
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[-1] != half or t.dtype != torch.float32:
            raise ValueError(f"{name}: expected float32 [..., 1, rot / 2 = {half}], got {t.dtype} {tuple(t.shape)}")
    if weight is not None and weight.shape != (D,):
        raise ValueError(f"weight: expected shape [D] = ({D},), got {tuple(weight.shape)}")
    if pick_backend(backend, x) == "ref":
        return rope_norm_ref(x, cos, sin, rot, weight, eps)
    from .triton_impl import rope_norm_triton

    return rope_norm_triton(x, cos, sin, rot, weight, eps)
