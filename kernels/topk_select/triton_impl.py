"""Triton kernel of `topk_select`: one program per row, the row's scores held in registers.

Each score becomes an order-preserving int32 key (the float's bits with the low 31 flipped when negative; -0
mapped to +0 and every NaN to the largest key, as torch's sort orders them; positions past `pos` below every
real key). A 32-step bitwise search finds the n-th largest key (n = min(top_k, pos + 1)): each step counts the
keys at or above a candidate with one block reduction. Keys above it are selected, and of the keys equal to it
the lowest positions (a prefix sum in position order), which is exactly the stable sort's tie rule. The n
selected (key, position) pairs are compacted through a scratch row (prefix-sum slots), joined into int64
(key, then reversed position) and sorted descending with tl.sort, so the output order is the stable sort's.
This replaces a full segmented radix sort of the row (several launches) with one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _topk_select_kernel(s_ptr, pos_ptr, out_ptr, sk_ptr, sp_ptr, T, top_k, s_stride, o_stride,
                        BT: tl.constexpr, BK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BT)
    pos = tl.load(pos_ptr + row).to(tl.int32)
    x = tl.load(s_ptr + row * s_stride + offs, mask=offs < T, other=0.0)
    x = tl.where(x == 0.0, 0.0, x)                        # -0 ties with +0
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)              # signed int32 order == float order
    key = tl.where(x != x, 0x7FFFFFFF, key)               # NaN above +inf
    key = tl.where((offs <= pos) & (offs < T), key, -2147483648)
    n = tl.minimum(tl.minimum(top_k, pos + 1), T)
    # the n-th largest key: bits of its unsigned form (key + 2^31) from the top
    thr = tl.zeros((), dtype=tl.int64)
    for b in tl.static_range(31, -1, -1):
        cand = thr | (1 << b)
        cnt = tl.sum((key >= (cand - 2147483648).to(tl.int32)).to(tl.int32), axis=0)
        thr = tl.where(cnt >= n, cand, thr)
    th = (thr - 2147483648).to(tl.int32)
    gt = key > th
    eq = key == th
    need = n - tl.sum(gt.to(tl.int32), axis=0)
    sel = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(sk_ptr + row * BK + slot, key, mask=sel)
    tl.store(sp_ptr + row * BK + slot, offs, mask=sel)
    tl.debug_barrier()  # every thread's scatter lands before the gather below
    r = tl.arange(0, BK)
    k2 = tl.load(sk_ptr + row * BK + r, mask=r < n, other=-2147483648).to(tl.int64) + 2147483648
    p2 = tl.load(sp_ptr + row * BK + r, mask=r < n, other=0).to(tl.int64)
    comp = tl.sort((k2 << 31) | (2147483647 - p2), descending=True)
    res = (2147483647 - (comp & 2147483647)).to(tl.int32)
    tl.store(out_ptr + row * o_stride + r, tl.where(r < n, res, -1), mask=r < top_k)


def topk_select_triton(scores: torch.Tensor, pos: torch.Tensor, top_k: int) -> torch.Tensor:
    N, T = scores.shape
    out = torch.empty(N, top_k, dtype=torch.int32, device=scores.device)
    if N == 0 or top_k == 0:
        return out
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        scores = scores.float().contiguous()
    BT, BK = triton.next_power_of_2(max(T, 2)), triton.next_power_of_2(max(top_k, 2))
    sk = torch.empty(N, BK, dtype=torch.int32, device=scores.device)
    sp = torch.empty(N, BK, dtype=torch.int32, device=scores.device)
    nw = 16 if BT >= 8192 else (8 if BT >= 2048 else 4)
    _topk_select_kernel[(N,)](scores, pos, out, sk, sp, T, top_k, scores.stride(0), out.stride(0), BT=BT, BK=BK,
                              num_warps=nw)
    return out
