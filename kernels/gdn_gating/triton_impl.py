"""Triton kernel of `gdn_gating`: one program per block of rows, [BLOCK_M, HV] tiles; replaces the
ten small torch ops (casts, add, softplus, exp, neg, mul, sigmoid) of the GDN gates with one launch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._tl import _softplus


@triton.jit
def _gdn_gating_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, M, a_m, b_m,
                       HV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    mh = h < HV
    mask = (rows < M)[:, None] & mh[None, :]
    A = -tl.exp(tl.load(A_log_ptr + h, mask=mh, other=0.0).to(tl.float32))
    dtb = tl.load(dt_bias_ptr + h, mask=mh, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows[:, None] * a_m + h[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * b_m + h[None, :], mask=mask, other=0.0).to(tl.float32)
    out = rows[:, None] * HV + h[None, :]
    tl.store(g_ptr + out, A[None, :] * _softplus(a + dtb[None, :]), mask=mask)
    tl.store(beta_ptr + out, tl.sigmoid(b), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])  # a view whenever the leading dims collapse (else a copy)
    return t if t.stride(-1) == 1 else t.contiguous()


def gdn_gating_triton(a, b, A_log, dt_bias, *, block_m: int | None = None):
    HV = a.shape[-1]
    a2, b2 = _rows(a), _rows(b)
    M = a2.shape[0]
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if M:
        block_h = triton.next_power_of_2(HV)
        block_m = block_m or max(1, min(64, 2048 // block_h))
        _gdn_gating_kernel[(triton.cdiv(M, block_m),)](
            a2, b2, A_log.contiguous(), dt_bias.contiguous(), g, beta, M, a2.stride(0), b2.stride(0),
            HV=HV, BLOCK_M=block_m, BLOCK_H=block_h, num_warps=4 if block_m * block_h >= 1024 else 1)
    return g, beta
