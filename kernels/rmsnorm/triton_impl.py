"""Triton kernel of `rmsnorm` / `gated_rmsnorm`: one program per (row, block of groups); a plain
RMSNorm row (or a gated row of <= 4096 channels) is one program.

The program loads its [BLOCK_G, group] tile once (and the gate tile), takes the fp32 mean of squares
per group, scales, multiplies by the weight and stores in x's dtype: one read of x (and z), one write.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _rmsnorm_kernel(
    x_ptr, z_ptr, r_ptr, s_ptr, w_ptr, out_ptr, x_m, z_m, r_m, s_m, o_m, eps,
    GS: tl.constexpr, NG: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_R: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    s = tl.arange(0, BLOCK_S)
    col = g[:, None] * GS + s[None, :]
    mask = (g < NG)[:, None] & (s < GS)[None, :]
    h = tl.load(x_ptr + row * x_m + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_R:  # residual add first, rounded to x's dtype and stored (the add it replaces), then normalised
        h = h + tl.load(r_ptr + row * r_m + col, mask=mask, other=0.0).to(tl.float32)
        if ROUND_OUT:
            h = _round_bf16(h)
        h = h.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * s_m + col, h, mask=mask)
        h = h.to(tl.float32)
    if HAS_Z:
        zv = tl.load(z_ptr + row * z_m + col, mask=mask, other=0.0).to(tl.float32)
        h = h * (zv * tl.sigmoid(zv))
    r = tl.math.rsqrt(tl.sum(h * h, axis=1) / GS + eps)
    y = h * r[:, None] * tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    if ROUND_OUT:  # the interpreter's fp32 -> bf16 cast truncates
        y = _round_bf16(y)
    tl.store(out_ptr + row * o_m + col, y.to(out_ptr.dtype.element_ty), mask=mask)


def default_config(D: int, group_size: int) -> tuple[int, int, int]:
    """(BLOCK_G, BLOCK_S, num_warps): whole groups, up to 4096 channels a program (more only when one
    group is wider), ~16 fp32 values a thread."""
    block_s = triton.next_power_of_2(group_size)
    block_g = max(1, min(triton.next_power_of_2(D // group_size), 4096 // block_s))
    return block_g, block_s, max(1, min(16, block_g * block_s // 512))


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])  # a view whenever the leading dims collapse (else a copy)
    return t if t.stride(-1) == 1 else t.contiguous()


def rmsnorm_triton(x, z, weight, eps, group_size, *, residual=None, block_g: int | None = None,
                   num_warps: int | None = None):
    """Returns norm; with `residual`: (x + residual, norm(x + residual))."""
    D = x.shape[-1]
    x2 = _rows(x)
    z2 = _rows(z) if z is not None else x2  # placeholder pointer, never read without a gate
    r2 = _rows(residual) if residual is not None else x2  # likewise without a residual
    s2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if residual is not None else x2
    weight = weight if weight.stride(0) == 1 else weight.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    M = x2.shape[0]
    if M:
        bg, bs, nw = default_config(D, group_size)
        block_g, num_warps = block_g or bg, num_warps or nw
        ng = D // group_size
        _rmsnorm_kernel[(M, triton.cdiv(ng, block_g))](
            x2, z2, r2, s2, weight, out, x2.stride(0), z2.stride(0), r2.stride(0), s2.stride(0), out.stride(0),
            float(eps), GS=group_size, NG=ng, BLOCK_G=block_g, BLOCK_S=bs, HAS_Z=z is not None,
            HAS_R=residual is not None,
            ROUND_OUT=os.environ.get("TRITON_INTERPRET") == "1" and out.dtype == torch.bfloat16,
            num_warps=num_warps,
        )
    if residual is not None:
        return s2.view(x.shape), out.view(x.shape)
    return out.view(x.shape)
