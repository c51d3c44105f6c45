"""Gated DeltaNet gates from the `in_proj_ba` outputs (Qwen3-Next):

    g    = -exp(A_log) * softplus(a + dt_bias)      (log decay, fp32)
    beta = sigmoid(b)                               (fp32)
a, b [..., HV] in any float dtype (row-strided views of one projection are fine), A_log, dt_bias [HV].
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import gdn_gating_ref

__all__ = ["gdn_gating", "gdn_gating_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *,
               backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (g, beta), fp32 [..., HV]. backend: "auto" (Triton on CUDA, reference otherwise) |
    "triton" | "ref". No autograd."""
    if a.dim() < 1 or a.shape[-1] == 0 or b.shape != a.shape:
        raise ValueError(f"a/b: expected two [..., HV] tensors of one shape, got {tuple(a.shape)} / {tuple(b.shape)}")
    HV = a.shape[-1]
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if t.shape != (HV,):
            raise ValueError(f"{name}: expected shape [HV] = ({HV},), got {tuple(t.shape)}")
    for name, t in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: expected dtype float32, bfloat16 or float16, got {t.dtype}")
        if t.device != a.device:
            raise ValueError(f"{name}: expected device {a.device} (a's), got {t.device}")
    if pick_backend(backend, a) == "ref":
        return gdn_gating_ref(a, b, A_log, dt_bias)
    from .triton_impl import gdn_gating_triton

    return gdn_gating_triton(a, b, A_log, dt_bias)
