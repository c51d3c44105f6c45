"""Triton kernel of `gdn_decode`: one program per (batch row, value head, tile of V rows).

The state is [.., V, K] with K contiguous, so every V row of the update is independent: a program
streams its [BLOCK_V, K] tile once (load, decay, delta-rule correction, store) and reduces along K
for S k and S q. q / k (K values) are re-normalised per tile; that is a few hundred bytes against a
tile of 8-16 KiB. A padding row (slot id < 0) reads and writes no state and stores o = 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import round_flags, strides
from .._tl import _head_tile, _round_bf16, _slot_of, _tile_mask


@triton.jit
def _gdn_decode_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, slot_ptr, o_ptr,
    s_slot, s_h, s_v, s_k,
    q_b, q_h, q_k,
    k_b, k_h, k_k,
    v_b, v_h, v_v,
    g_b, g_h,
    be_b, be_h,
    o_b, o_h, o_v,
    scale,
    K: tl.constexpr, V: tl.constexpr, HV_PER_HK: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, USE_L2NORM: tl.constexpr,
    ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b, h, vt, hk = _head_tile(V, BLOCK_V, HV_PER_HK)
    slot, valid = _slot_of(slot_ptr, b)

    offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_v = offs_v < V
    mask_k = offs_k < K
    # state rows: none for a padding row (its o row is still written, with zeros)
    s_mask_v = offs_v < tl.where(valid, V, 0)
    s_ptrs = state_ptr + slot * s_slot + h * s_h + offs_v[:, None] * s_v + offs_k[None, :] * s_k
    s_mask = _tile_mask(s_mask_v, mask_k, K, BLOCK_K)
    S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)

    q = tl.load(q_ptr + b * q_b + hk * q_h + offs_k * q_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * k_b + hk * k_h + offs_k * k_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    q = q * scale
    v = tl.load(v_ptr + b * v_b + h * v_h + offs_v * v_v, mask=mask_v, other=0.0).to(tl.float32)
    alpha = tl.exp(tl.load(g_ptr + b * g_b + h * g_h).to(tl.float32))
    beta = tl.load(beta_ptr + b * be_b + h * be_h).to(tl.float32)

    S = S * alpha
    u = beta * (v - tl.sum(S * k[None, :], axis=1))
    S = S + u[:, None] * k[None, :]
    if ROUND_STATE:
        tl.store(s_ptrs, _round_bf16(S).to(state_ptr.dtype.element_ty), mask=s_mask)
    else:
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)

    o = tl.sum(S * q[None, :], axis=1)
    o = tl.where(valid, o, 0.0)
    if ROUND_OUT:
        o = _round_bf16(o)
    tl.store(o_ptr + b * o_b + h * o_h + offs_v * o_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)


def default_config(state_dtype: torch.dtype, V: int, K: int, rows: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps) for `rows` = batch x heads. Picked on an H200 (bench --sweep):
    a [BLOCK_V, K] state tile of 16 KiB with 8 warps was fastest or within 2 % of it at
    batch 32 and 256 (90-94 % of HBM at 256, fp32 state); at batch 1 (~1000 programs or fewer) all
    tile sizes land within ~1 µs, there V is split down to 8 rows to put ~1024 programs in flight."""
    elt = torch.finfo(state_dtype).bits // 8
    block_k = triton.next_power_of_2(K)
    block = max(1, min(triton.next_power_of_2(V), (16384 // elt) // block_k))
    while block > 8 and rows * triton.cdiv(V, block) < 1024:
        block //= 2
    return block, 8 if block * block_k * elt >= 16384 else 4


def resolve_config(state_dtype: torch.dtype, V: int, K: int, rows: int, block_v: int | None,
                   num_warps: int | None) -> tuple[int, int]:
    """(BLOCK_V, num_warps): default_config's, each overridden where given (shared with the window kernel)."""
    bv, nw = default_config(state_dtype, V, K, rows)
    return block_v or bv, num_warps or nw


def gdn_decode_triton(state, q, k, v, g, beta, slot_ids, scale=None, use_qk_l2norm=True, out=None,
                      *, block_v: int | None = None, num_warps: int | None = None):
    batch, HV, V = v.shape
    Hk, K = q.shape[1], q.shape[2]
    o = torch.empty_like(v) if out is None else out
    if batch == 0:
        return o
    block_v, num_warps = resolve_config(state.dtype, V, K, batch * HV, block_v, num_warps)
    _gdn_decode_kernel[(HV * triton.cdiv(V, block_v), batch)](
        state, q, k, v, g, beta, slot_ids, o, *strides(state, q, k, v, g, beta, o),
        float(K ** -0.5 if scale is None else scale),
        K=K, V=V, HV_PER_HK=HV // Hk,
        BLOCK_K=triton.next_power_of_2(K), BLOCK_V=block_v, USE_L2NORM=bool(use_qk_l2norm),
        **round_flags(state, o),
        num_warps=num_warps,
    )
    return o
