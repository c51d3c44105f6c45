"""Triton kernel of `index_scores`: one program per (BLOCK_T keys, query row).

The program loads its BLOCK_T cached keys straight from the paged cache (page table → row; fp8 e4m3 or bf16,
widened in registers: e4m3 values are exact in bf16), the row's query [H, d] and weights [H], forms the
[H, BLOCK_T] dot products as one tl.dot (bf16 operands with fp32 accumulation when q is bf16 — q, w and the
keys are bf16/fp8 values, so every product is exact and only the summation order differs from an fp32 GEMM;
fp32 q takes an IEEE fp32 dot), then ReLU, the weighted sum over heads and the per-token scale. This replaces
the torch path's page gather, fp8 → fp32 widening of every key, fp32 batched GEMM and the [N, H, T]
intermediate. A key's score depends only on (q row, key, kernel config), not on the grid, so decode (paged)
and prefill (contiguous keys) give equal bits for equal inputs.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _index_scores_kernel(q_ptr, w_ptr, k_ptr, sc_ptr, pg_ptr, out_ptr, T, H, D, bs, sq_n, sq_h, sw_n, sk_r,
                         spg_n, so_n, PAGED: tl.constexpr, HAS_SCALE: tl.constexpr, BH: tl.constexpr,
                         BD: tl.constexpr, BLOCK_T: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    # grid (key tiles, rows): the tiles of one row are launched together (one request's pages)
    n = tl.program_id(1).to(tl.int64)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = offs_t < T
    offs_h = tl.arange(0, BH)
    hm = offs_h < H
    offs_d = tl.arange(0, BD)
    dm = offs_d < D
    if PAGED:
        page = tl.load(pg_ptr + n * spg_n + offs_t // bs, mask=tm, other=0).to(tl.int64)
        row = page * bs + offs_t % bs
    else:
        row = offs_t.to(tl.int64)
    k = tl.load(k_ptr + row[:, None] * sk_r + offs_d[None, :], mask=tm[:, None] & dm[None, :], other=0.0)
    q = tl.load(q_ptr + n * sq_n + offs_h[:, None] * sq_h + offs_d[None, :], mask=hm[:, None] & dm[None, :],
                other=0.0)
    w = tl.load(w_ptr + n * sw_n + offs_h, mask=hm, other=0.0).to(tl.float32)
    dots = tl.dot(q.to(DOT_DT), tl.trans(k.to(DOT_DT)), input_precision=PREC)          # [BH, BLOCK_T] fp32
    s = tl.sum(tl.maximum(dots, 0.0) * w[:, None], axis=0)
    if HAS_SCALE:
        s = s * tl.load(sc_ptr + row, mask=tm, other=0.0)
    tl.store(out_ptr + n * so_n + offs_t, s, mask=tm)


def index_scores_triton(q, w, keys, scale, pages, block_t: int = 64, num_warps: int = 4) -> torch.Tensor:
    N, H, D = q.shape
    paged = pages is not None
    if paged:
        bs = keys.shape[1]
        T = pages.shape[1] * bs
        krows = keys.reshape(-1, D)
    else:
        bs, T, krows = 1, keys.shape[0], keys
    out = torch.empty(N, T, dtype=torch.float32, device=q.device)
    if N == 0 or T == 0:
        return out
    if krows.stride(-1) != 1:
        krows = krows.contiguous()
    sc = None if scale is None else scale.reshape(-1).contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    # Triton's interpreter computes bf16 dots wrongly (numpy has no bf16): widen to fp32 there (exact)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    low = q.dtype in (torch.bfloat16, torch.float16) and not interp
    dot_dt = (tl.bfloat16 if q.dtype == torch.bfloat16 else tl.float16) if low else tl.float32
    pg = pages if paged else q  # unused pointer when not paged
    _index_scores_kernel[(triton.cdiv(T, block_t), N)](
        q, w, krows, sc if sc is not None else out, pg, out, T, H, D, bs, q.stride(0), q.stride(1), w.stride(0),
        krows.stride(0), pg.stride(0) if paged else 0, out.stride(0),
        PAGED=paged, HAS_SCALE=sc is not None, BH=max(16, triton.next_power_of_2(H)),
        BD=max(16, triton.next_power_of_2(D)), BLOCK_T=block_t, DOT_DT=dot_dt, PREC="tf32" if low else "ieee",
        num_warps=num_warps)
    return out
