"""Triton kernel of `rope_dtype`: one program per (row, block of heads), [BLOCK_H, d] tiles; each element's
rotation partner (d -/+ d/2) is a second load of the same lines. Both products and their sum are rounded to x's
dtype, as the three torch ops round them, so for bf16 / fp16 the output equals the reference's bit for bit on
the GPU (fp32 may differ by a contracted multiply-add): one launch instead of seven (two slices' four products,
a difference, a sum and the cat)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _rnd(v, y_ptr, ROUND_BF16: tl.constexpr):
    if ROUND_BF16:  # the interpreter's fp32 -> bf16 cast truncates
        return _round_bf16(v)
    return v.to(y_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _rope_dtype_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, x_r, x_h, c_r, s_r, y_r, y_h,
                       D: tl.constexpr, HALF: tl.constexpr, BD: tl.constexpr, BLOCK_H: tl.constexpr,
                       ROUND_BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BD)
    m = (h < H)[:, None] & (d < D)[None, :]
    lo = d < HALF
    pd = tl.where(lo, d + HALF, d - HALF)  # the partner dim
    base = x_ptr + row * x_r + h[:, None] * x_h
    x = tl.load(base + d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(base + pd[None, :], mask=m, other=0.0).to(tl.float32)
    ci = tl.where(lo, d, d - HALF)
    c = tl.load(cos_ptr + row * c_r + ci, mask=d < D, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + row * s_r + ci, mask=d < D, other=0.0).to(tl.float32)[None, :]
    xc = _rnd(x * c, y_ptr, ROUND_BF16)
    ps = _rnd(xp * s, y_ptr, ROUND_BF16)
    y = _rnd(tl.where(lo[None, :], xc - ps, xc + ps), y_ptr, ROUND_BF16)
    tl.store(y_ptr + row * y_r + h[:, None] * y_h + d[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


def rope_dtype_triton(x, cos, sin):
    B, N, H, D = x.shape
    x3 = x.reshape(B * N, H, D)  # a view whenever the leading dims collapse (else a copy)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    c2, s2 = cos.reshape(B * N, D // 2), sin.reshape(B * N, D // 2)
    if c2.stride(-1) != 1 or s2.stride(-1) != 1:
        c2, s2 = c2.contiguous(), s2.contiguous()
    y = torch.empty(B, N, H, D, dtype=x.dtype, device=x.device)
    y3 = y.view(B * N, H, D)
    if B * N and H:
        bd = triton.next_power_of_2(D)
        bh = max(1, min(triton.next_power_of_2(H), 4096 // bd))
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        _rope_dtype_kernel[(B * N, triton.cdiv(H, bh))](
            x3, c2, s2, y3, H, x3.stride(0), x3.stride(1), c2.stride(0), s2.stride(0), y3.stride(0), y3.stride(1),
            D=D, HALF=D // 2, BD=bd, BLOCK_H=bh, ROUND_BF16=interp and y.dtype == torch.bfloat16,
            num_warps=4 if bh * bd >= 2048 else 1)
    return y
