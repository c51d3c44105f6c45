"""Triton kernels of `conv1d_window` / `conv1d_window_commit`: one program per (batch row, block of channels).

Window: per position t the taps t..t + width - 1 of [state row, x] come as one [channels, taps] tile (state
taps and window inputs by two masked loads), fp32 accumulation of tap * weight, + bias, SiLU, one rounding to
the output dtype (as conv1d_update does for a single token). Commit: the row's width - 1 kept inputs (taps
accepted.. of [state row, x]) as one tile, loaded whole before the store, so the in-place shift never reads a
tap it has already overwritten.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _taps(x_ptr, state_ptr, s_rows, b, offs, jj, p, mask, x_b, x_t, x_c, s_k, KM1: tl.constexpr, K: tl.constexpr,
          ROUND_STATE: tl.constexpr):
    """[BLOCK_C, KP] tile of [state row, x]'s taps p (p = start + jj, jj < K), in the state's dtype."""
    live = mask[:, None] & (jj[None, :] < K)
    st = tl.load(s_rows + p[None, :] * s_k, mask=live & (p[None, :] < KM1), other=0.0)
    xv = tl.load(x_ptr + b * x_b + (p[None, :] - KM1) * x_t + offs[:, None] * x_c,
                 mask=live & (p[None, :] >= KM1), other=0.0)
    if ROUND_STATE:  # the interpreter's fp32 -> bf16 cast truncates
        xs = _round_bf16(xv.to(tl.float32)).to(state_ptr.dtype.element_ty)
    else:
        xs = xv.to(state_ptr.dtype.element_ty)
    return tl.where(p[None, :] < KM1, st, xs)


@triton.jit
def _conv1d_window_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, rows_ptr, out_ptr,
    C, T, x_b, x_t, x_c, s_slot, s_c, s_k, w_c, w_k, o_b, o_t, o_c,
    KM1: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr, ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    jj = tl.arange(0, KP)
    mask = offs < C
    row = tl.load(rows_ptr + b).to(tl.int64)
    s_rows = state_ptr + row * s_slot + offs[:, None] * s_c
    w = tl.load(w_ptr + offs[:, None] * w_c + jj[None, :] * w_k, mask=mask[:, None] & (jj[None, :] <= KM1),
                other=0.0).to(tl.float32)
    bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for t in range(T):
        win = _taps(x_ptr, state_ptr, s_rows, b, offs, jj, t + jj, mask, x_b, x_t, x_c, s_k, KM1, K, ROUND_STATE)
        acc = tl.sum(win.to(tl.float32) * w, axis=1)
        if HAS_BIAS:
            acc += bias
        if SILU:
            acc = acc * tl.sigmoid(acc)
        if ROUND_OUT:
            acc = _round_bf16(acc)
        tl.store(out_ptr + b * o_b + t * o_t + offs * o_c, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv1d_window_commit_kernel(
    x_ptr, state_ptr, rows_ptr, acc_ptr,
    C, x_b, x_t, x_c, s_slot, s_c, s_k,
    KM1: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, ROUND_STATE: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    jj = tl.arange(0, KP)
    mask = offs < C
    row = tl.load(rows_ptr + b).to(tl.int64)
    a = tl.load(acc_ptr + b).to(tl.int64)
    s_rows = state_ptr + row * s_slot + offs[:, None] * s_c
    kept = _taps(x_ptr, state_ptr, s_rows, b, offs, jj, a + jj, mask, x_b, x_t, x_c, s_k, KM1, KM1, ROUND_STATE)
    tl.store(s_rows + jj[None, :] * s_k, kept, mask=mask[:, None] & (jj[None, :] < KM1))


def _config(C: int) -> tuple[int, int]:
    """(BLOCK_C, num_warps), as conv1d_update's launcher picks them."""
    block = min(1024, triton.next_power_of_2(C))
    return block, 4 if block >= 512 else (2 if block >= 128 else 1)


def conv1d_window_triton(x, conv_state, weight, bias, rows, silu=True):
    B, T, C = x.shape
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    if B == 0 or T == 0:
        return y
    block, nw = _config(C)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    km1 = conv_state.shape[-1]
    _conv1d_window_kernel[(triton.cdiv(C, block), B)](
        x, conv_state, weight, bias if bias is not None else weight, rows, y,
        C, T, *x.stride(), *conv_state.stride(), *weight.stride(), *y.stride(),
        KM1=km1, K=km1 + 1, KP=triton.next_power_of_2(km1 + 1), BLOCK_C=block, HAS_BIAS=bias is not None, SILU=silu,
        ROUND_STATE=interp and conv_state.dtype == torch.bfloat16, ROUND_OUT=interp and y.dtype == torch.bfloat16,
        num_warps=nw,
    )
    return y


def conv1d_window_commit_triton(x, conv_state, rows, accepted):
    B, T, C = x.shape
    if B == 0:
        return
    block, nw = _config(C)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    km1 = conv_state.shape[-1]
    _conv1d_window_commit_kernel[(triton.cdiv(C, block), B)](
        x, conv_state, rows, accepted, C, *x.stride(), *conv_state.stride(),
        KM1=km1, KP=triton.next_power_of_2(km1), BLOCK_C=block,
        ROUND_STATE=interp and conv_state.dtype == torch.bfloat16, num_warps=nw,
    )
