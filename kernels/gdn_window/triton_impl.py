"""Triton kernel of `gdn_decode_window`: one program per (batch row, value head, tile of V rows).

The state is [.., V, K] with K contiguous, so every V row of the update is independent. A program
loads its [BLOCK_V, K] source tile once, keeps it in registers and steps through the T window
positions: per position it reads q_t / k_t (re-normalised per tile), v_t, g_t, beta_t, applies the
decay and delta-rule correction, stores the tile to that position's destination slot and writes
o_t. State traffic is (1 + T) tiles per window, against 2 T for T separate decode steps. The source
tile is loaded before any store, so a destination may be the row's own source slot. A padding row
(source id < 0) reads and writes no state and stores o = 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import round_flags, strides
from .._tl import _head_tile, _round_bf16, _slot_of, _tile_mask
from ..gdn_decode.triton_impl import resolve_config


@triton.jit
def _gdn_window_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, src_ptr, dst_ptr, o_ptr,
    s_slot, s_h, s_v, s_k,
    q_b, q_t, q_h, q_k,
    k_b, k_t, k_h, k_k,
    v_b, v_t, v_h, v_v,
    g_b, g_t, g_h,
    be_b, be_t, be_h,
    o_b, o_t, o_h, o_v,
    d_b, d_t,
    scale,
    T: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HV_PER_HK: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, USE_L2NORM: tl.constexpr,
    CARRY_CAST: tl.constexpr, ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b, h, vt, hk = _head_tile(V, BLOCK_V, HV_PER_HK)
    src, valid = _slot_of(src_ptr, b)

    offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_v = offs_v < V
    mask_k = offs_k < K
    tile = h * s_h + offs_v[:, None] * s_v + offs_k[None, :] * s_k
    # state rows: none for a padding row (its o rows are still written, with zeros)
    s_mask_v = offs_v < tl.where(valid, V, 0)
    s_mask = _tile_mask(s_mask_v, mask_k, K, BLOCK_K)
    S = tl.load(state_ptr + src * s_slot + tile, mask=s_mask, other=0.0).to(tl.float32)

    for t in tl.static_range(T):
        dst = tl.load(dst_ptr + b * d_b + t * d_t).to(tl.int64)
        w_mask_v = offs_v < tl.where(valid & (dst >= 0), V, 0)
        if BLOCK_K == K:
            w_mask = w_mask_v[:, None]
        else:
            w_mask = w_mask_v[:, None] & mask_k[None, :]
        dst = tl.maximum(dst, 0)

        q = tl.load(q_ptr + b * q_b + t * q_t + hk * q_h + offs_k * q_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + b * k_b + t * k_t + hk * k_h + offs_k * k_k, mask=mask_k, other=0.0).to(tl.float32)
        if USE_L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q * scale
        v = tl.load(v_ptr + b * v_b + t * v_t + h * v_h + offs_v * v_v, mask=mask_v, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(g_ptr + b * g_b + t * g_t + h * g_h).to(tl.float32))
        beta = tl.load(beta_ptr + b * be_b + t * be_t + h * be_h).to(tl.float32)

        S = S * alpha
        u = beta * (v - tl.sum(S * k[None, :], axis=1))
        S = S + u[:, None] * k[None, :]
        o = tl.sum(S * q[None, :], axis=1)
        # store S_t in the state dtype and carry the stored value on (= T eager decode steps)
        # inline, not _tl._store_carry: through the helper one bf16 cvt moves in this kernel's PTX (kept equal)
        if ROUND_STATE:
            Sq = _round_bf16(S)
            tl.store(state_ptr + dst * s_slot + tile, Sq.to(state_ptr.dtype.element_ty), mask=w_mask)
            S = Sq
        else:
            Sq = S.to(state_ptr.dtype.element_ty)
            tl.store(state_ptr + dst * s_slot + tile, Sq, mask=w_mask)
            if CARRY_CAST:
                S = Sq.to(tl.float32)

        o = tl.where(valid, o, 0.0)
        if ROUND_OUT:
            o = _round_bf16(o)
        tl.store(o_ptr + b * o_b + t * o_t + h * o_h + offs_v * o_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)


def gdn_decode_window_triton(state, q, k, v, g, beta, src_ids, dst_ids, scale=None, use_qk_l2norm=True,
                             out=None, *, block_v: int | None = None, num_warps: int | None = None):
    batch, T, HV, V = v.shape
    Hk, K = q.shape[2], q.shape[3]
    o = torch.empty_like(v) if out is None else out
    if batch == 0:
        return o
    # the eager decode's tiling (same tile per program, T x the work): T = 1 compiles to its kernel
    block_v, num_warps = resolve_config(state.dtype, V, K, batch * HV, block_v, num_warps)
    _gdn_window_kernel[(HV * triton.cdiv(V, block_v), batch)](
        state, q, k, v, g, beta, src_ids, dst_ids, o, *strides(state, q, k, v, g, beta, o, dst_ids),
        float(K ** -0.5 if scale is None else scale),
        T=T, K=K, V=V, HV_PER_HK=HV // Hk,
        BLOCK_K=triton.next_power_of_2(K), BLOCK_V=block_v, USE_L2NORM=bool(use_qk_l2norm),
        CARRY_CAST=state.dtype != torch.float32,
        **round_flags(state, o),
        num_warps=num_warps,
    )
    return o
