"""Triton kernel of `sparse_attention`: one program per (query row, KV head).

The program holds the query heads of its group as a [REP, D] tile, walks its id list in blocks of
BLOCK_K, gathers those K/V rows (one row = nkv*hd contiguous values; the gather is a row-indexed
load, so rows anywhere in the pool cost the same) and keeps an online softmax. Masked ids (-1) load
nothing and score -inf; a row with no live id writes zeros. fp32 math, IEEE dots.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sparse_attn_kernel(
    q_ptr, k_ptr, v_ptr, ids_ptr, o_ptr,
    q_n, q_h, q_d,
    k_r, k_h, k_d,
    v_r, v_h, v_d,
    ids_n, ids_k,
    o_n, o_h, o_d,
    K, scale,
    REP: tl.constexpr, D: tl.constexpr,
    REP_P: tl.constexpr, D_P: tl.constexpr, BLOCK_K: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    offs_r = tl.arange(0, REP_P)
    offs_d = tl.arange(0, D_P)
    mask_r = offs_r < REP
    mask_d = offs_d < D
    heads = g * REP + offs_r
    q = tl.load(q_ptr + n * q_n + heads[:, None] * q_h + offs_d[None, :] * q_d,
                mask=mask_r[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([REP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_P], tl.float32)
    acc = tl.zeros([REP_P, D_P], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        rid = tl.load(ids_ptr + n * ids_n + offs_k * ids_k, mask=offs_k < K, other=-1).to(tl.int64)
        live = rid >= 0
        rid = tl.maximum(rid, 0)
        kv_mask = live[:, None] & mask_d[None, :]
        kb = tl.load(k_ptr + rid[:, None] * k_r + g * k_h + offs_d[None, :] * k_d, mask=kv_mask,
                     other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(kb), input_precision="ieee") * scale        # [REP_P, BLOCK_K]
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vb = tl.load(v_ptr + rid[:, None] * v_r + g * v_h + offs_d[None, :] * v_d, mask=kv_mask,
                     other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + n * o_n + heads[:, None] * o_h + offs_d[None, :] * o_d, o.to(o_ptr.dtype.element_ty),
             mask=mask_r[:, None] & mask_d[None, :])


def sparse_attention_triton(q, k_cache, v_cache, ids, scale, out=None, block_k: int | None = None,
                            num_warps: int = 4):
    N, nq, hd = q.shape
    nkv = k_cache.shape[1]
    rep = nq // nkv
    K = ids.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if N == 0:
        return out
    rep_p = max(16, triton.next_power_of_2(rep))
    d_p = max(16, triton.next_power_of_2(hd))
    # fp32 dot operands are staged in shared memory (K and V tiles [BLOCK_K, D_P] + q): 576-value rows
    # (head_dim 288 -> D_P 512) at BLOCK_K 64 need ~300 KB, over Hopper's 227 KB; 32 fits
    cap = 64 if d_p <= 256 else 32
    block_k = block_k or max(16, min(cap, triton.next_power_of_2(max(K, 1))))
    _sparse_attn_kernel[(N, nkv)](
        q, k_cache, v_cache, ids, out,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *ids.stride(), *out.stride(),
        K, scale, REP=rep, D=hd, REP_P=rep_p, D_P=d_p, BLOCK_K=block_k, num_warps=num_warps)
    return out
