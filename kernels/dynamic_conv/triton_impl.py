"""Triton kernel of `dynamic_conv`: one program per (row of the block, block of channels). Each op of the
torch form (kernel = dyn + base, the tap products, the masked shifted taps, the running sum) is rounded to
x's dtype where the torch form rounds, so for bf16 / fp16 the kernel's output equals the reference's bit for
bit on the GPU (fp32 may differ by a contracted multiply-add); the win is one launch for the ~8 small kernels
(repeat, add, mul, pad, ...) a convolution took."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _rnd(v, out_ptr, ROUND_BF16: tl.constexpr):
    """v (fp32) rounded to the output dtype and back: what one torch op in that dtype stores."""
    if ROUND_BF16:  # the interpreter's fp32 -> bf16 cast truncates
        return _round_bf16(v)
    return v.to(out_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _dynamic_conv_kernel(
    x_ptr, dyn_ptr, base_ptr, start_ptr, out_ptr,
    N, H, x_b, x_n, x_h, d_b, d_n, d_h, b_h, b_k, s_b, s_n, o_b, o_n, o_h,
    GROUP: tl.constexpr, TAPS: tl.constexpr, BLOCK_H: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    r = tl.program_id(1).to(tl.int64)
    b, t = r // N, r % N
    offs = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    start = tl.load(start_ptr + b * s_b + t * s_n)
    x = tl.load(x_ptr + b * x_b + t * x_n + offs * x_h, mask=mask, other=0.0).to(tl.float32)
    drow = dyn_ptr + b * d_b + t * d_n + (offs // GROUP) * TAPS * d_h
    k0 = _rnd(tl.load(drow, mask=mask, other=0.0).to(tl.float32)
              + tl.load(base_ptr + offs * b_h, mask=mask, other=0.0).to(tl.float32), out_ptr, ROUND_BF16)
    out = _rnd(x + _rnd(k0 * x, out_ptr, ROUND_BF16), out_ptr, ROUND_BF16)
    for j in tl.static_range(1, TAPS):
        kj = _rnd(tl.load(drow + j * d_h, mask=mask, other=0.0).to(tl.float32)
                  + tl.load(base_ptr + offs * b_h + j * b_k, mask=mask, other=0.0).to(tl.float32), out_ptr,
                  ROUND_BF16)
        xs = tl.load(x_ptr + b * x_b + (t - j) * x_n + offs * x_h, mask=mask & (offs * 0 + t >= j),
                     other=0.0).to(tl.float32)
        inside = (t - j >= start).to(tl.float32)
        out = _rnd(out + _rnd(kj * xs, out_ptr, ROUND_BF16) * inside, out_ptr, ROUND_BF16)
    tl.store(out_ptr + b * o_b + t * o_n + offs * o_h, out.to(out_ptr.dtype.element_ty), mask=mask)


def dynamic_conv_triton(x, dyn, base, start, group: int):
    B, N, H = x.shape
    taps = base.shape[-1]
    out = torch.empty(B, N, H, dtype=x.dtype, device=x.device)
    if B * N == 0:
        return out
    block = min(1024, triton.next_power_of_2(H))
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    _dynamic_conv_kernel[(triton.cdiv(H, block), B * N)](
        x, dyn, base, start, out, N, H, *x.stride(), *dyn.stride(), *base.stride(), *start.stride(), *out.stride(),
        GROUP=group, TAPS=taps, BLOCK_H=block, ROUND_BF16=interp and x.dtype == torch.bfloat16,
        num_warps=4 if block >= 512 else 1,
    )
    return out
