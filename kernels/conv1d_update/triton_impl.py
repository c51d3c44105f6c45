"""Triton kernel of `conv1d_update`: one program per (batch row, block of channels).

A program loads its rows' width - 1 state taps and the weights as [channels, taps] tiles (one coalesced
span each) and the new input, accumulates sum_j window[j] * weight[:, j] + bias in fp32, stores the
shifted window back (taps 1.., then x in the state's dtype) and the (SiLU-ed) output. A padding row
(slot id < 0) touches no state and stores zeros. Memory bound: 2 x (width - 1) state elements per channel and row.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, slot_ptr, out_ptr,
    C, x_b, x_c, s_slot, s_c, s_k, w_c, w_k, o_b, o_c,
    KM1: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    jj = tl.arange(0, KP)                                # window tap j (0..KM1-1: state, KM1: x)
    mask = offs < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    valid = slot >= 0
    smask = offs < tl.where(valid, C, 0)  # no state rows for a padding row
    s_rows = state_ptr + tl.maximum(slot, 0) * s_slot + offs[:, None] * s_c

    xv = tl.load(x_ptr + b * x_b + offs * x_c, mask=mask, other=0.0)
    if ROUND_STATE:  # the interpreter's fp32 -> bf16 cast truncates
        xs = _round_bf16(xv.to(tl.float32)).to(state_ptr.dtype.element_ty)
    else:
        xs = xv.to(state_ptr.dtype.element_ty)
    # The row's taps as [BLOCK_C, KP] tiles: a channel's KM1 taps are contiguous, so each tile is one
    # coalesced span of the state, not KM1 loads and stores at stride KM1 (2-byte accesses 6 bytes apart
    # for bf16 width-4 convs). `nxt` (taps 1..KM1-1: the shifted window) re-reads the same lines from L1.
    taps = tl.load(s_rows + jj[None, :] * s_k, mask=smask[:, None] & (jj[None, :] < KM1), other=0.0)
    nxt = tl.load(s_rows + (jj[None, :] + 1) * s_k, mask=smask[:, None] & (jj[None, :] + 1 < KM1), other=0.0)
    win = tl.where(jj[None, :] == KM1, xs[:, None], taps).to(tl.float32)
    w = tl.load(w_ptr + offs[:, None] * w_c + jj[None, :] * w_k, mask=mask[:, None] & (jj[None, :] <= KM1),
                other=0.0).to(tl.float32)
    acc = tl.sum(win * w, axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(s_rows + jj[None, :] * s_k, tl.where(jj[None, :] == KM1 - 1, xs[:, None], nxt),
             mask=smask[:, None] & (jj[None, :] < KM1))

    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(valid, acc, 0.0)
    if ROUND_OUT:
        acc = _round_bf16(acc)
    tl.store(out_ptr + b * o_b + offs * o_c, acc.to(out_ptr.dtype.element_ty), mask=mask)


def default_config(C: int) -> tuple[int, int]:
    """(BLOCK_C, num_warps): 1024 channels on 4 warps (8 contiguous-ish channels a thread), smaller
    blocks for narrow layers."""
    block = min(1024, triton.next_power_of_2(C))
    return block, 4 if block >= 512 else (2 if block >= 128 else 1)


def conv1d_update_triton(x, conv_state, weight, bias, slot_ids, silu=True, out=None,
                         *, block_c: int | None = None, num_warps: int | None = None):
    batch, C = x.shape
    y = torch.empty(batch, C, dtype=x.dtype, device=x.device) if out is None else out
    if batch == 0:
        return y
    bc, nw = default_config(C)
    block_c, num_warps = block_c or bc, num_warps or nw
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    bb = bias if bias is not None else weight  # placeholder pointer, never read without a bias
    _conv1d_update_kernel[(triton.cdiv(C, block_c), batch)](
        x, conv_state, weight, bb, slot_ids, y,
        C, *x.stride(), *conv_state.stride(), *weight.stride(), *y.stride(),
        KM1=conv_state.shape[-1], KP=triton.next_power_of_2(conv_state.shape[-1] + 1),
        BLOCK_C=block_c, HAS_BIAS=bias is not None, SILU=silu,
        ROUND_STATE=interp and conv_state.dtype == torch.bfloat16, ROUND_OUT=interp and y.dtype == torch.bfloat16,
        num_warps=num_warps,
    )
    return y
