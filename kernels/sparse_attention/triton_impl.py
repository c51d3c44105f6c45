"""Triton kernels of `sparse_attention`: split-K (flash-decoding) over each row's id list.

A decode batch can be a handful of rows over one KV head (MLA-shaped presets: 32 query heads share one
576-value row), where one program per (row, KV head) would run a few programs on a 132-SM GPU, and
an id list can be a whole context (dense `kv=resident` decode passes every position's row). The id
list is cut into splits of CHUNK ids instead; grid (row x KV head, split):

1. `_sparse_attn_split_kernel`: the program holds its group's query heads as a [REP, D] tile, walks
   its ids in blocks of BLOCK_K, gathers those K/V rows (row-indexed loads: rows anywhere in the pool
   cost the same) and keeps an online softmax. With one split it writes the normalised output; with
   several it writes (max, sum, unnormalised accumulator) per head to fp32 scratch.
2. `_sparse_attn_combine_kernel`: one program per (row, query head) merges the splits.

CHUNK depends on the id-list length K only, never on the batch, so a row's output is the same bits
whatever else is in the batch (bucket padding, another policy's admission pattern). The head dim is
held as a power-of-two part D_A plus a power-of-two tail D_B (288 = 256 + 32, not padded to 512).
Dots run on the tensor cores in the rows' dtype with fp32 accumulation (fp32 rows: IEEE fp32 dots);
the probabilities enter the P·V dot in the rows' dtype, as in FlashAttention. Masked ids (-1) load
nothing and score -inf; a row with no live id writes zeros.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SPLITS_PER_ROW = 16   # most splits of one id list (K = 2048: 16 x 128 ids; K = 256 at BLOCK_K 32: 8 x 32)


@triton.jit
def _qk(q_a, q_b, k_ptrs_a, k_ptrs_b, kv_mask_a, kv_mask_b, HAS_B: tl.constexpr, PREC: tl.constexpr):
    kb = tl.load(k_ptrs_a, mask=kv_mask_a, other=0.0).to(q_a.dtype)
    s = tl.dot(q_a, tl.trans(kb), input_precision=PREC)
    if HAS_B:
        kb2 = tl.load(k_ptrs_b, mask=kv_mask_b, other=0.0).to(q_b.dtype)
        s += tl.dot(q_b, tl.trans(kb2), input_precision=PREC)
    return s


@triton.jit
def _sparse_attn_split_kernel(
    q_ptr, k_ptr, v_ptr, ids_ptr, o_ptr, ml_ptr, acc_ptr,
    q_n, q_h, q_d,
    k_r, k_h, k_d,
    v_r, v_h, v_d,
    ids_n, ids_k,
    o_n, o_h, o_d,
    K, CHUNK, scale,
    NKV: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
    REP_P: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
    WIDEN: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    s_id = tl.program_id(1)
    n = pid // NKV
    g = pid % NKV
    HAS_B: tl.constexpr = D_B > 0
    offs_r = tl.arange(0, REP_P)
    offs_a = tl.arange(0, D_A)
    offs_b = D_A + tl.arange(0, D_B if HAS_B else 16)
    mask_r = offs_r < REP
    mask_a = offs_a < D
    mask_b = offs_b < D
    heads = g * REP + offs_r
    q_row = q_ptr + n * q_n + heads[:, None] * q_h
    kdt = tl.float32 if WIDEN else k_ptr.dtype.element_ty   # dots in the rows' dtype
    q_a = tl.load(q_row + offs_a[None, :] * q_d, mask=mask_r[:, None] & mask_a[None, :], other=0.0).to(kdt)
    q_b = tl.load(q_row + offs_b[None, :] * q_d, mask=mask_r[:, None] & mask_b[None, :], other=0.0).to(kdt)
    m_i = tl.full([REP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([REP_P], tl.float32)
    acc_a = tl.zeros([REP_P, D_A], tl.float32)
    acc_b = tl.zeros([REP_P, D_B if HAS_B else 16], tl.float32)
    start = s_id * CHUNK
    end = tl.minimum(start + CHUNK, K)
    for k0 in range(start, end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        rid = tl.load(ids_ptr + n * ids_n + offs_k * ids_k, mask=offs_k < end, other=-1).to(tl.int64)
        live = rid >= 0
        rid = tl.maximum(rid, 0)
        ma = live[:, None] & mask_a[None, :]
        mb = live[:, None] & mask_b[None, :]
        s = _qk(q_a, q_b, k_ptr + rid[:, None] * k_r + g * k_h + offs_a[None, :] * k_d,
                k_ptr + rid[:, None] * k_r + g * k_h + offs_b[None, :] * k_d, ma, mb, HAS_B, PREC) * scale
        s = tl.where(live[None, :], s, float("-inf"))                       # [REP_P, BLOCK_K]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        va = tl.load(v_ptr + rid[:, None] * v_r + g * v_h + offs_a[None, :] * v_d, mask=ma, other=0.0).to(kdt)
        acc_a = acc_a * alpha[:, None] + tl.dot(p.to(va.dtype), va, input_precision=PREC)
        if HAS_B:
            vb = tl.load(v_ptr + rid[:, None] * v_r + g * v_h + offs_b[None, :] * v_d, mask=mb, other=0.0).to(kdt)
            acc_b = acc_b * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PREC)
        m_i = m_new
    if SPLITS == 1:
        inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)
        o_row = o_ptr + n * o_n + heads[:, None] * o_h
        tl.store(o_row + offs_a[None, :] * o_d, (acc_a * inv[:, None]).to(o_ptr.dtype.element_ty),
                 mask=mask_r[:, None] & mask_a[None, :])
        if HAS_B:
            tl.store(o_row + offs_b[None, :] * o_d, (acc_b * inv[:, None]).to(o_ptr.dtype.element_ty),
                     mask=mask_r[:, None] & mask_b[None, :])
    else:
        part = (n * NKV * REP + heads) * SPLITS + s_id                       # [REP_P] (row, head, split)
        tl.store(ml_ptr + part * 2, m_i, mask=mask_r)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=mask_r)
        tl.store(acc_ptr + part[:, None] * D + offs_a[None, :], acc_a, mask=mask_r[:, None] & mask_a[None, :])
        if HAS_B:
            tl.store(acc_ptr + part[:, None] * D + offs_b[None, :], acc_b, mask=mask_r[:, None] & mask_b[None, :])


@triton.jit
def _sparse_attn_combine_kernel(
    ml_ptr, acc_ptr, o_ptr, o_n, o_h, o_d,
    NQ: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, S_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)                 # row * NQ + head
    n = pid // NQ
    h = pid % NQ
    offs_s = tl.arange(0, S_P)
    ms = offs_s < SPLITS
    m = tl.load(ml_ptr + (pid * SPLITS + offs_s) * 2, mask=ms, other=float("-inf"))
    den = tl.load(ml_ptr + (pid * SPLITS + offs_s) * 2 + 1, mask=ms, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp(m - m_safe)                               # 0 for splits with no live id
    total = tl.sum(w * den, axis=0)
    w = w / tl.where(total > 0, total, 1.0)
    for d0 in tl.static_range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        md = offs_d < D
        acc = tl.load(acc_ptr + (pid * SPLITS + offs_s)[:, None] * D + offs_d[None, :],
                      mask=ms[:, None] & md[None, :], other=0.0)
        o = tl.sum(acc * w[:, None], axis=0)
        tl.store(o_ptr + n * o_n + h * o_h + offs_d * o_d, o.to(o_ptr.dtype.element_ty), mask=md)


def head_split(hd: int) -> tuple[int, int]:
    """(D_A, D_B): the head dim as a power of two plus a power-of-two tail (0: none), e.g. 288 = 256 + 32."""
    p2 = triton.next_power_of_2(hd)
    d_a = max(16, p2 if p2 == hd else p2 // 2)
    d_b = 0 if d_a >= hd else max(16, triton.next_power_of_2(hd - d_a))
    return (d_a, d_b) if d_a + d_b <= p2 else (max(16, p2), 0)   # a split that saves nothing: plain padding


def split_plan(K: int, hd: int, splits_per_row: int = SPLITS_PER_ROW, block_k: int | None = None
               ) -> tuple[int, int, int]:
    """(BLOCK_K, CHUNK ids per split, splits) for an id list of length K: a function of K and the head dim
    alone (see the module docstring), CHUNK a multiple of BLOCK_K."""
    block_k = block_k or (32 if sum(head_split(hd)) > 128 else 64)
    blocks = triton.cdiv(max(K, 1), block_k)
    per = triton.cdiv(blocks, splits_per_row)
    return block_k, per * block_k, triton.cdiv(blocks, per)


def sparse_attention_triton(q, k_cache, v_cache, ids, scale, out=None, block_k: int | None = None,
                            num_warps: int = 4, splits_per_row: int = SPLITS_PER_ROW):
    N, nq, hd = q.shape
    nkv = k_cache.shape[1]
    rep = nq // nkv
    K = ids.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if N == 0:
        return out
    if K == 0:
        return out.zero_()
    rep_p = max(16, triton.next_power_of_2(rep))
    d_a, d_b = head_split(hd)
    block_k, chunk, splits = split_plan(K, hd, splits_per_row, block_k)
    # Triton's interpreter computes bf16/fp16 dots wrongly (numpy has no bf16): there the operands are widened
    # to fp32 (exactly) and the probabilities stay fp32; the GPU runs the native dots (GPU test).
    widen = k_cache.dtype != torch.float32 and os.environ.get("TRITON_INTERPRET") == "1"
    prec = "ieee" if k_cache.dtype == torch.float32 or widen else "tf32"   # "tf32": unused by bf16/fp16 dots
    if splits > 1:
        ml = torch.empty(N * nq * splits * 2, dtype=torch.float32, device=q.device)
        acc = torch.empty(N * nq * splits * hd, dtype=torch.float32, device=q.device)
    else:
        ml = acc = out  # unused
    _sparse_attn_split_kernel[(N * nkv, splits)](
        q, k_cache, v_cache, ids, out, ml, acc,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *ids.stride(), *out.stride(),
        K, chunk, scale, NKV=nkv, REP=rep, D=hd, SPLITS=splits,
        REP_P=rep_p, D_A=d_a, D_B=d_b, BLOCK_K=block_k, PREC=prec, WIDEN=widen,
        num_warps=num_warps)
    if splits > 1:
        _sparse_attn_combine_kernel[(N * nq,)](
            ml, acc, out, *out.stride(), NQ=nq, D=hd, SPLITS=splits, S_P=max(2, triton.next_power_of_2(splits)),
            BLOCK_D=min(128, max(16, triton.next_power_of_2(hd))), num_warps=2)
    return out
