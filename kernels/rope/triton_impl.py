"""Triton kernel of `rope_norm`: one program per (row, block of heads), [BLOCK_H, D] tiles. Each element's
rotation partner (d -/+ rot/2) is a second load of the same lines (L1), normalised with the same head scale."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _rope_norm_kernel(x_ptr, cos_ptr, sin_ptr, w_ptr, y_ptr, H, x_r, x_h, c_r, y_r, y_h, eps,
                      D: tl.constexpr, BD: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                      HAS_W: tl.constexpr, ROUND: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BD)
    m = (h < H)[:, None] & (d < D)[None, :]
    lo = d < HALF                                   # first half of the rotated dims
    rotd = d < 2 * HALF
    pd = tl.where(lo, d + HALF, d - HALF)           # the partner dim (used only where rotd)
    base = x_ptr + row * x_r + h[:, None] * x_h
    x = tl.load(base + d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(base + pd[None, :], mask=m & rotd[None, :], other=0.0).to(tl.float32)
    if HAS_W:  # per-head RMSNorm; the torch path rounds its output to x's dtype before the rotation
        r = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        x = x * r * tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)[None, :]
        xp = xp * r * tl.load(w_ptr + pd, mask=rotd, other=0.0).to(tl.float32)[None, :]
        if ROUND:  # the interpreter's fp32 -> bf16 cast truncates
            x, xp = _round_bf16(x), _round_bf16(xp)
        x = x.to(y_ptr.dtype.element_ty).to(tl.float32)
        xp = xp.to(y_ptr.dtype.element_ty).to(tl.float32)
    ci = tl.where(lo, d, d - HALF)
    c = tl.load(cos_ptr + row * c_r + ci, mask=rotd, other=1.0)[None, :]
    s = tl.load(sin_ptr + row * c_r + ci, mask=rotd, other=0.0)[None, :]
    # lo: x c - x_partner s; hi: x c + x_partner s (two products, then the sum: the torch path's roundings)
    ps = xp * s
    y = tl.where(rotd[None, :], x * c + tl.where(lo[None, :], -ps, ps), x)
    if ROUND:
        y = _round_bf16(y)
    tl.store(y_ptr + row * y_r + h[:, None] * y_h + d[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


def rope_norm_triton(x, cos, sin, rot: int, weight, eps: float):
    *lead, H, D = x.shape
    half = rot // 2
    x3 = x.reshape(-1, H, D)  # a view whenever the leading dims collapse (else a copy)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    R = x3.shape[0]
    c2 = cos.expand(*lead, 1, half).reshape(R, half)
    s2 = sin.expand(*lead, 1, half).reshape(R, half)
    if c2.stride(-1) != 1 or s2.stride() != c2.stride():
        c2, s2 = c2.contiguous(), s2.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y3 = y.view(R, H, D)
    if R and H:
        bd = triton.next_power_of_2(D)
        bh = max(1, min(triton.next_power_of_2(H), 4096 // bd))
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        _rope_norm_kernel[(R, triton.cdiv(H, bh))](
            x3, c2, s2, weight if weight is not None else x3, y3, H, x3.stride(0), x3.stride(1), c2.stride(0),
            y3.stride(0), y3.stride(1), float(eps), D=D, BD=bd, HALF=half, BLOCK_H=bh, HAS_W=weight is not None,
            ROUND=interp and y.dtype == torch.bfloat16, num_warps=4 if bh * bd >= 2048 else 1)
    return y
