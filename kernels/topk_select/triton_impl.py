"""Triton kernels of `topk_select`: one program per row, or each row split over many programs.

Each score becomes an order-preserving int32 key (the float's bits with the low 31 flipped when negative; -0
mapped to +0 and every NaN to the largest key, as torch's sort orders them; positions past `pos` below every
real key). Both paths find the n-th largest key th (n = min(top_k, pos + 1)), select every key above th and, of
the keys equal to it, the lowest positions (exactly the stable sort's tie rule), and order the n selected
(key, position) pairs by the int64 (key, then reversed position), so the output order is the stable sort's.

Single program (more than SPLIT_ROWS rows of up to SPLIT_T scores): the row held in registers; a 32-step
bitwise search finds th (each step counts the keys at or above a candidate with one block reduction); the
selected pairs are compacted through a scratch row (prefix-sum slots) and sorted with tl.sort. One launch, but
only N programs: at N = 1..8 rows most of the 132 SMs idle and the program's latency grows with the row (H200:
50 µs at 16384 scores, 87 at 32768).

Split (a few rows, or longer ones): grid (rows, chunks of CHUNK scores) so every SM works, six launches after one
memset:
 - 4 radix passes of 8 bits: each program histograms (tl.histogram) the current digit of its keys whose higher
   digits match th's found so far, and adds the histogram into the row's global one (int32 atomics: the counts,
   and so th, are deterministic). Each program derives th's next digit from the histogram the previous pass
   completed, on top of the digits its first program stored: no per-row launch between passes. The last pass
   also stores each chunk's histogram.
 - compaction: keys above th take scratch slots [0, n - need) through a per-row atomic counter (any order: the
   last launch orders them); keys equal to th take [n - need, n) in position order, ranked after the equal keys
   of earlier chunks (read from their stored last-digit histograms).
 - ranking: each program takes a block of scratch entries and counts, per entry, the larger (key, position)
   pairs of its row: that count is its output slot (all pairs differ), so no single-program sort is needed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The split path for a few rows (the SMs the single program leaves idle) or rows past SPLIT_T, one program per
# row otherwise (docs/tuning/topk_select.md).
SPLIT_T = 32768  # the single program holds at most this many scores in registers (measured up to here)
SPLIT_ROWS = 8   # at most this many rows take the split path whatever their length
CHUNK = 2048     # scores per program of the split path
RANK_BLOCK = 32  # scratch entries ranked per program of the split path


@triton.jit
def _row_n(pos_ptr, row, T, top_k):
    # (last visible position, n = selection size) of a row
    pos = tl.minimum(tl.load(pos_ptr + row).to(tl.int64), T - 1).to(tl.int32)
    return pos, tl.minimum(top_k, pos + 1)


@triton.jit
def _keys(s_row_ptr, offs, pos, T):
    x = tl.load(s_row_ptr + offs, mask=offs < T, other=0.0)
    x = tl.where(x == 0.0, 0.0, x)                        # -0 ties with +0
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)              # signed int32 order == float order
    key = tl.where(x != x, 0x7FFFFFFF, key)               # NaN above +inf
    return tl.where(offs <= pos, key, -2147483648)        # also past T: pos <= T - 1


@triton.jit
def _th_digit(hrow, n, LVL: tl.constexpr):
    # th's digits 0..LVL (in place, of the unsigned key) and how many of the keys matching them rank at or above th
    # (the n-th largest), from the state after digit LVL - 1 (stored by radix pass LVL) and histogram LVL.
    # hrow: [0, 1024) the 4 digit histograms, [1024, 1030) (digits, rem) after digits 0, 1, 2, 1030 the slot counter
    if LVL == 0:
        pref = tl.zeros((), dtype=tl.int32)
        rem = n
    else:
        pref = tl.load(hrow + 1022 + 2 * LVL)
        rem = tl.load(hrow + 1023 + 2 * LVL)
    b = tl.arange(0, 256)
    h = tl.load(hrow + LVL * 256 + b)
    at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
    d = tl.sum((at_or_above >= rem).to(tl.int32), axis=0) - 1  # the largest digit with >= rem at or above it
    return pref | (d << (24 - 8 * LVL)), rem - tl.sum(tl.where(b > d, h, 0), axis=0)


@triton.jit
def _topk_select_kernel(s_ptr, pos_ptr, out_ptr, sk_ptr, sp_ptr, T, top_k, s_stride, o_stride,
                        BT: tl.constexpr, BK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BT)
    pos, n = _row_n(pos_ptr, row, T, top_k)
    key = _keys(s_ptr + row * s_stride, offs, pos, T)
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


@triton.jit
def _chunk_keys(s_ptr, pos_ptr, hist_ptr, T, top_k, s_stride, h_stride, CH: tl.constexpr):
    # a split-path program's (row, chunk, positions, last visible position, n, keys, the row's histogram row)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * CH + tl.arange(0, CH)
    pos, n = _row_n(pos_ptr, row, T, top_k)
    return row, chunk, offs, pos, n, _keys(s_ptr + row * s_stride, offs, pos, T), hist_ptr + row * h_stride


@triton.jit
def _radix_pass_kernel(s_ptr, pos_ptr, hist_ptr, chist_ptr, T, top_k, s_stride, h_stride, n_chunks,
                       LVL: tl.constexpr, CH: tl.constexpr):
    row, chunk, offs, pos, n, key, hrow = _chunk_keys(s_ptr, pos_ptr, hist_ptr, T, top_k, s_stride, h_stride, CH)
    u = key ^ -2147483648                                 # unsigned order in the bits
    live = offs <= pos
    if LVL > 0:
        pref, rem = _th_digit(hrow, n, LVL - 1)
        tl.store(hrow + 1022 + 2 * LVL, pref, mask=chunk == 0)  # the state the next launch starts from
        tl.store(hrow + 1023 + 2 * LVL, rem, mask=chunk == 0)
        live &= (u & (-1 << (32 - 8 * LVL))) == pref
    h = tl.histogram((u >> (24 - 8 * LVL)) & 255, 256, mask=live)
    b = tl.arange(0, 256)
    tl.atomic_add(hrow + LVL * 256 + b, h, mask=h > 0, sem="relaxed")
    if LVL == 3:
        tl.store(chist_ptr + (row * n_chunks + chunk) * 256 + b, h)


@triton.jit
def _compact_kernel(s_ptr, pos_ptr, hist_ptr, chist_ptr, sk_ptr, sp_ptr, T, top_k, s_stride, h_stride, n_chunks,
                    CH: tl.constexpr, NCH: tl.constexpr):
    row, chunk, offs, pos, n, key, hrow = _chunk_keys(s_ptr, pos_ptr, hist_ptr, T, top_k, s_stride, h_stride, CH)
    pref, need = _th_digit(hrow, n, 3)                    # need: keys equal to th to take (0 when n <= 0)
    th = pref ^ -2147483648
    gt = key > th                                         # th is a visible key when n > 0: hidden ones lie below
    eq = (key == th) & (offs <= pos)
    c = tl.arange(0, NCH)
    eq_before = tl.sum(tl.load(chist_ptr + (row * n_chunks + c) * 256 + (pref & 255), mask=c < chunk, other=0),
                       axis=0)
    eq_rank = eq_before + tl.cumsum(eq.to(tl.int32), axis=0) - 1
    base = tl.atomic_add(hrow + 1030, tl.sum(gt.to(tl.int32), axis=0), sem="relaxed")
    slot = tl.where(gt, base + tl.cumsum(gt.to(tl.int32), axis=0) - 1, n - need + eq_rank)
    sel = gt | (eq & (eq_rank < need))
    tl.store(sk_ptr + row * top_k + slot, key, mask=sel)
    tl.store(sp_ptr + row * top_k + slot, offs, mask=sel)


@triton.jit
def _rank_kernel(sk_ptr, sp_ptr, pos_ptr, out_ptr, T, top_k, o_stride, RB: tl.constexpr, CB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * RB + tl.arange(0, RB)
    _, n = _row_n(pos_ptr, row, T, top_k)
    ki = tl.load(sk_ptr + row * top_k + i, mask=i < n, other=0).to(tl.int64) + 2147483648
    pi = tl.load(sp_ptr + row * top_k + i, mask=i < n, other=0)
    ci = (ki << 31) | (2147483647 - pi.to(tl.int64))
    above = tl.zeros((RB, CB), dtype=tl.int32)           # reduced once, after the loop
    for j0 in range(0, n, CB):
        j = j0 + tl.arange(0, CB)
        kj = tl.load(sk_ptr + row * top_k + j, mask=j < n, other=-2147483648).to(tl.int64) + 2147483648
        pj = tl.load(sp_ptr + row * top_k + j, mask=j < n, other=2147483647).to(tl.int64)
        cj = (kj << 31) | (2147483647 - pj)               # below every real pair when masked
        above += (cj[None, :] > ci[:, None]).to(tl.int32)
    rank = tl.sum(above, axis=1)
    tl.store(out_ptr + row * o_stride + rank, pi, mask=i < n)
    tl.store(out_ptr + row * o_stride + i, -1, mask=(i >= n) & (i < top_k))


def topk_select_triton(scores: torch.Tensor, pos: torch.Tensor, top_k: int, *, split: bool | None = None,
                       chunk: int = CHUNK) -> torch.Tensor:
    """split: None = the split path for at most SPLIT_ROWS rows or rows longer than SPLIT_T scores, the single
    program otherwise; True / False force one. chunk: scores per program of the split path (a power of 2)."""
    N, T = scores.shape
    out = torch.empty(N, top_k, dtype=torch.int32, device=scores.device)
    if N == 0 or top_k == 0:
        return out
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        scores = scores.float().contiguous()
    if split is None:
        split = N <= SPLIT_ROWS or T > SPLIT_T
    dev = scores.device
    if not split:
        BT, BK = triton.next_power_of_2(max(T, 2)), triton.next_power_of_2(max(top_k, 2))
        sk = torch.empty(N, BK, dtype=torch.int32, device=dev)
        sp = torch.empty(N, BK, dtype=torch.int32, device=dev)
        nw = 16 if BT >= 8192 else (8 if BT >= 2048 else 4)
        _topk_select_kernel[(N,)](scores, pos, out, sk, sp, T, top_k, scores.stride(0), out.stride(0), BT=BT,
                                  BK=BK, num_warps=nw)
        return out
    n_chunks = triton.cdiv(T, chunk)
    # per row: 4 digit histograms (8-bit digits: tl.histogram's cost grows with its bins), state, slot counter
    hist = torch.zeros(N, 4 * 256 + 7, dtype=torch.int32, device=dev)
    chist = torch.empty(N, n_chunks, 256, dtype=torch.int32, device=dev)  # per chunk: its last-digit histogram
    sk = torch.empty(N, top_k, dtype=torch.int32, device=dev)
    sp = torch.empty(N, top_k, dtype=torch.int32, device=dev)
    nw = 8 if chunk >= 2048 else 4
    for lvl in range(4):
        _radix_pass_kernel[(N, n_chunks)](scores, pos, hist, chist, T, top_k, scores.stride(0), hist.stride(0),
                                          n_chunks, LVL=lvl, CH=chunk, num_warps=nw)
    _compact_kernel[(N, n_chunks)](scores, pos, hist, chist, sk, sp, T, top_k, scores.stride(0), hist.stride(0),
                                   n_chunks, CH=chunk, NCH=triton.next_power_of_2(n_chunks), num_warps=nw)
    _rank_kernel[(N, triton.cdiv(top_k, RANK_BLOCK))](sk, sp, pos, out, T, top_k, out.stride(0), RB=RANK_BLOCK,
                                                      CB=256, num_warps=4)
    return out
