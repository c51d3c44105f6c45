"""Triton kernel of `mamba2_decode_window`: one program per (batch row, head, tile of P rows).

A program loads its [BLOCK_P, N] source tile once, keeps it in registers and steps through the T
window positions: per position it reads the small inputs (x tile, dt, B/C of the head's group),
updates the tile, stores it to that position's destination slot and writes y_t. State traffic is
(1 + T) tiles per window (read once, write T times), against 2 T for T separate decode steps.
The source tile is loaded before any store, so a destination may be the row's own source slot.
A padding row (source id < 0) reads and writes no state and stores y = 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import round_flags, strides
from .._tl import _head_tile, _round_bf16, _slot_of, _softplus, _store_carry, _tile_mask
from ..mamba2_decode.triton_impl import resolve_config


@triton.jit
def _mamba2_window_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr, src_ptr, dst_ptr, z_ptr, y_ptr,
    s_slot, s_h, s_p, s_n,
    x_b, x_t, x_h, x_p,
    dt_b, dt_t, dt_h,
    B_b, B_t, B_g, B_n,
    C_b, C_t, C_g, C_n,
    z_b, z_t, z_h, z_p,
    y_b, y_t, y_h, y_p,
    d_b, d_t,
    T: tl.constexpr, P: tl.constexpr, N: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr,
    CARRY_CAST: tl.constexpr, ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b, h, pt, g = _head_tile(P, BLOCK_P, HEADS_PER_GROUP)
    src, valid = _slot_of(src_ptr, b)

    offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    tile = h * s_h + offs_p[:, None] * s_p + offs_n[None, :] * s_n
    # state rows: none for a padding row (its y rows are still written, with zeros)
    s_mask_p = offs_p < tl.where(valid, P, 0)
    s_mask = _tile_mask(s_mask_p, mask_n, N, BLOCK_N)
    S = tl.load(state_ptr + src * s_slot + tile, mask=s_mask, other=0.0).to(tl.float32)

    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    for t in tl.static_range(T):
        dst = tl.load(dst_ptr + b * d_b + t * d_t).to(tl.int64)
        w_mask_p = offs_p < tl.where(valid & (dst >= 0), P, 0)
        if BLOCK_N == N:
            w_mask = w_mask_p[:, None]
        else:
            w_mask = w_mask_p[:, None] & mask_n[None, :]
        dst = tl.maximum(dst, 0)

        x = tl.load(x_ptr + b * x_b + t * x_t + h * x_h + offs_p * x_p, mask=mask_p, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * dt_b + t * dt_t + h * dt_h).to(tl.float32) + bias
        dt = _softplus(dt)
        dA = tl.exp(dt * A)
        Bv = tl.load(B_ptr + b * B_b + t * B_t + g * B_g + offs_n * B_n, mask=mask_n, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + b * C_b + t * C_t + g * C_g + offs_n * C_n, mask=mask_n, other=0.0).to(tl.float32)

        S = S * dA + (dt * x)[:, None] * Bv[None, :]
        y = tl.sum(S * Cv[None, :], axis=1) + Dh * x
        # store S_t in the state dtype and carry the stored value on (= T eager decode steps)
        S = _store_carry(state_ptr + dst * s_slot + tile, S, w_mask, ROUND_STATE, CARRY_CAST)

        if HAS_Z:
            zv = tl.load(z_ptr + b * z_b + t * z_t + h * z_h + offs_p * z_p, mask=mask_p,
                         other=0.0).to(tl.float32)
            y = y * (zv * tl.sigmoid(zv))
        y = tl.where(valid, y, 0.0)
        if ROUND_OUT:
            y = _round_bf16(y)
        tl.store(y_ptr + b * y_b + t * y_t + h * y_h + offs_p * y_p, y.to(y_ptr.dtype.element_ty), mask=mask_p)


def mamba2_decode_window_triton(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z=None, out=None,
                                *, block_p: int | None = None, num_warps: int | None = None):
    batch, T, H, P = x.shape
    N = state.shape[-1]
    G = B.shape[2]
    y = torch.empty_like(x) if out is None else out
    if batch == 0:
        return y
    # the eager decode's tiling (same tile per program, T x the work): T = 1 compiles to its kernel
    block_p, num_warps = resolve_config(state.dtype, P, N, batch * H, block_p, num_warps)
    zz = z if z is not None else x  # placeholder pointer, never read when HAS_Z is False
    _mamba2_window_kernel[(H * triton.cdiv(P, block_p), batch)](
        state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, zz, y, *strides(state, x, dt, B, C, zz, y, dst_ids),
        T=T, P=P, N=N, HEADS_PER_GROUP=H // G,
        BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(N), HAS_Z=z is not None,
        CARRY_CAST=state.dtype != torch.float32,
        **round_flags(state, y),
        num_warps=num_warps,
    )
    return y
