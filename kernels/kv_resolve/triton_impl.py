"""Triton kernel of `kv_resolve`: one program per (request row) of one layer, the whole resolve fused.

Per program: load the request's top-k positions; (adaptive) a resident page answers directly; the
newest token maps to the reserved slot; every other position is looked up in the per-token reverse
map (`slot_of`, paged beside the indexer keys: a direct-mapped hash with no collisions). Hits are
marked in a per-slot scratch row, the LRU order is scanned once (prefix sums) to hand the m misses
the m least recently used unhit slots, the victims' old positions leave the reverse map, the misses
enter it, the LRU order is rewritten (untouched slots keep their order, touched ones move to the MRU
end in top-k order), and a compacted copy plan (src row, device row per miss) is written. The missed
rows are then copied src → device with row-wide vector loads (src is the pinned host pool on a GPU,
read through unified addressing) — by a second launch that spreads each request's misses over many
programs (default), or inside the resolve program (`split=0`). Barriers order the scratch
round-trips inside the program; nothing touches another request's state, so programs never race.
Stage path (`stage`, the default for up to 8 request rows): staging programs in the same launch copy the missed
host rows to device staging rows while the resolve runs, and the second launch copies staging → hot rows
(see `_resolve_kernel`), so the host copy no longer waits for the single-program resolve.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _resolve_kernel(
    sel_ptr, sel_n, rows_ptr, pos_ptr,
    res_ptr, res_s, hot_tab_ptr, hot_tab_s, hot_pos_ptr, hot_pos_s, lru_ptr, lru_s,
    idx_tab_ptr, idx_tab_s, sof_ptr, src_tab_ptr, src_tab_s, src_ptr, dev_ptr,
    ids_ptr, ids_n, nmiss_ptr, vict_ptr, plan_ptr, mark_ptr, mark_s, stage_ptr, cnt_ptr,
    K, B, W, bs, fast_limit,
    HAS_RES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_B: tl.constexpr,
    COPY_J: tl.constexpr, BLOCK_W: tl.constexpr, FUSED_COPY: tl.constexpr, STAGE: tl.constexpr = 0,
):
    """Grid (N,), or with STAGE = the number of staging programs per request, (STAGE + 1, N): programs
    0..STAGE-1 of request n each classify COPY_J of its selected positions exactly as below and copy their missed
    host rows into staging row n*K + j right away (no victim needed yet), then count themselves done; program
    STAGE is the resolve, which runs beside them and waits for that count only before its first write to the
    reverse map (the one state they read). Its copy plan then names staging rows, and the second launch copies
    device to device. Deadlock-free: staging programs never wait."""
    if STAGE:
        if tl.program_id(0) < STAGE:
            _stage_chunk(sel_ptr, sel_n, rows_ptr, pos_ptr, res_ptr, res_s, idx_tab_ptr, idx_tab_s, sof_ptr,
                         src_tab_ptr, src_tab_s, src_ptr, stage_ptr, cnt_ptr, tl.program_id(1).to(tl.int64),
                         tl.program_id(0), K, W, bs, fast_limit, HAS_RES, COPY_J, BLOCK_W)
        else:
            _resolve_row(tl.program_id(1).to(tl.int64), sel_ptr, sel_n, rows_ptr, pos_ptr,
                         res_ptr, res_s, hot_tab_ptr, hot_tab_s, hot_pos_ptr, hot_pos_s, lru_ptr, lru_s,
                         idx_tab_ptr, idx_tab_s, sof_ptr, src_tab_ptr, src_tab_s, src_ptr, dev_ptr,
                         ids_ptr, ids_n, nmiss_ptr, vict_ptr, plan_ptr, mark_ptr, mark_s, cnt_ptr,
                         K, B, W, bs, fast_limit, HAS_RES, BLOCK_K, BLOCK_B, COPY_J, BLOCK_W, FUSED_COPY, STAGE)
    else:
        _resolve_row(tl.program_id(0).to(tl.int64), sel_ptr, sel_n, rows_ptr, pos_ptr,
                     res_ptr, res_s, hot_tab_ptr, hot_tab_s, hot_pos_ptr, hot_pos_s, lru_ptr, lru_s,
                     idx_tab_ptr, idx_tab_s, sof_ptr, src_tab_ptr, src_tab_s, src_ptr, dev_ptr,
                     ids_ptr, ids_n, nmiss_ptr, vict_ptr, plan_ptr, mark_ptr, mark_s, cnt_ptr,
                     K, B, W, bs, fast_limit, HAS_RES, BLOCK_K, BLOCK_B, COPY_J, BLOCK_W, FUSED_COPY, STAGE)


@triton.jit
def _resolve_row(
    n, sel_ptr, sel_n, rows_ptr, pos_ptr,
    res_ptr, res_s, hot_tab_ptr, hot_tab_s, hot_pos_ptr, hot_pos_s, lru_ptr, lru_s,
    idx_tab_ptr, idx_tab_s, sof_ptr, src_tab_ptr, src_tab_s, src_ptr, dev_ptr,
    ids_ptr, ids_n, nmiss_ptr, vict_ptr, plan_ptr, mark_ptr, mark_s, cnt_ptr,
    K, B, W, bs, fast_limit,
    HAS_RES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_B: tl.constexpr,
    COPY_J: tl.constexpr, BLOCK_W: tl.constexpr, FUSED_COPY: tl.constexpr, STAGE: tl.constexpr,
):
    """The resolve of request row n (the module docstring's state machine)."""
    offs = tl.arange(0, BLOCK_K)
    kmask = offs < K
    r, P, p, valid, lp, off, resident, rid = _selected(sel_ptr, sel_n, rows_ptr, pos_ptr, res_ptr, res_s, n, offs,
                                                       kmask, bs, HAS_RES)
    if P < fast_limit:
        # short sequence (hisparse): hot slot j holds position j; no lookups, no LRU work
        # resident positions (a window's draft pages) may lie past the hot buffer's pages: not loaded
        hp = tl.load(hot_tab_ptr + r * hot_tab_s + lp, mask=valid & (~resident), other=0).to(tl.int64)
        out = tl.where(resident, rid, tl.where(valid, hp * bs + off, -1))
        tl.store(ids_ptr + n * ids_n + offs, out.to(tl.int32), mask=kmask)
        tl.store(nmiss_ptr + n, 0)
        if STAGE:
            _stage_join(cnt_ptr + n, STAGE)
    else:
        newest = valid & (~resident) & (p == P)
        look = valid & (~resident) & (~newest)
        hpn = tl.load(hot_tab_ptr + r * hot_tab_s + B // bs).to(tl.int64)
        nrow = hpn * bs + B % bs
        if tl.sum(look.to(tl.int32), 0) == 0:
            out = tl.where(resident, rid, tl.where(newest, nrow, -1))
            tl.store(ids_ptr + n * ids_n + offs, out.to(tl.int32), mask=kmask)
            tl.store(nmiss_ptr + n, 0)
            if STAGE:
                _stage_join(cnt_ptr + n, STAGE)
        else:
            ipage = tl.load(idx_tab_ptr + r * idx_tab_s + lp, mask=look, other=0).to(tl.int64)
            irow = ipage * bs + off
            s = tl.load(sof_ptr + irow, mask=look, other=-1).to(tl.int64)
            hit = look & (s >= 0)
            miss = look & (s < 0)
            sc = tl.maximum(s, 0)
            tl.store(mark_ptr + r * mark_s + sc, 1, mask=hit)
            tl.debug_barrier()
            offs_b = tl.arange(0, BLOCK_B)
            bmask = offs_b < B
            L = tl.load(lru_ptr + r * lru_s + offs_b, mask=bmask, other=0).to(tl.int64)
            mk = tl.load(mark_ptr + r * mark_s + L, mask=bmask, other=1)
            nh = bmask & (mk == 0)
            crank = tl.cumsum(nh.to(tl.int32), 0) - 1
            m = tl.sum(miss.to(tl.int32), 0)
            victim = nh & (crank < m)
            tl.store(vict_ptr + n * K + crank, L, mask=victim)
            tl.debug_barrier()
            mrank = tl.cumsum(miss.to(tl.int32), 0) - 1
            v = tl.load(vict_ptr + n * K + mrank, mask=miss, other=-1).to(tl.int64)
            vc = tl.maximum(v, 0)
            # victims' old positions leave the reverse map; the missed positions enter it (STAGE: once every
            # staging program has read it)
            if STAGE:
                _stage_join(cnt_ptr + n, STAGE)
            q = tl.load(hot_pos_ptr + r * hot_pos_s + vc, mask=miss, other=-1).to(tl.int64)
            qv = miss & (q >= 0)
            qc = tl.maximum(q, 0)
            qpage = tl.load(idx_tab_ptr + r * idx_tab_s + qc // bs, mask=qv, other=0).to(tl.int64)
            tl.store(sof_ptr + qpage * bs + qc % bs, -1, mask=qv)
            tl.store(sof_ptr + irow, v.to(tl.int32), mask=miss)
            tl.store(hot_pos_ptr + r * hot_pos_s + vc, p.to(tl.int32), mask=miss)
            slot = tl.where(hit, s, v)
            sl = tl.maximum(slot, 0)
            hp = tl.load(hot_tab_ptr + r * hot_tab_s + sl // bs, mask=look, other=0).to(tl.int64)
            hrow = hp * bs + sl % bs
            out = tl.where(resident, rid, tl.where(newest, nrow, tl.where(look, hrow, -1)))
            tl.store(ids_ptr + n * ids_n + offs, out.to(tl.int32), mask=kmask)
            spage = tl.load(src_tab_ptr + r * src_tab_s + lp, mask=miss, other=0).to(tl.int64)
            kept = nh & (~victim)
            kr = tl.cumsum(kept.to(tl.int32), 0) - 1
            nk = tl.sum(kept.to(tl.int32), 0)
            touched = hit | miss
            tr = tl.cumsum(touched.to(tl.int32), 0) - 1
            tl.debug_barrier()  # every thread has read the old LRU order and the victim list
            # copy plan, compacted by miss rank: src row -> plan, dst row -> vict
            if STAGE:
                tl.store(plan_ptr + n * K + mrank, n * K + offs, mask=miss)  # the staging row
            else:
                tl.store(plan_ptr + n * K + mrank, spage * bs + off, mask=miss)
            tl.store(vict_ptr + n * K + mrank, hrow, mask=miss)
            tl.store(lru_ptr + r * lru_s + kr, L.to(tl.int32), mask=kept)
            tl.store(lru_ptr + r * lru_s + nk + tr, slot.to(tl.int32), mask=touched)
            tl.store(mark_ptr + r * mark_s + sc, 0, mask=hit)
            tl.store(nmiss_ptr + n, m)
            if FUSED_COPY:
                tl.debug_barrier()
                _copy_plan(plan_ptr + n * K, vict_ptr + n * K, src_ptr, dev_ptr, 0, m, 1, W, COPY_J, BLOCK_W)


@triton.jit
def _selected(sel_ptr, sel_n, rows_ptr, pos_ptr, res_ptr, res_s, n, offs, omask, bs, HAS_RES: tl.constexpr):
    """Request row n's selected positions at offs (omask): (slot r, newest position P, p, valid, logical page lp,
    offset in page, resident, resident row id). Shared by the resolve and its staging programs, which must
    classify every position alike."""
    r = tl.load(rows_ptr + n).to(tl.int64)
    P = tl.load(pos_ptr + n).to(tl.int64)
    p = tl.load(sel_ptr + n * sel_n + offs, mask=omask, other=-1).to(tl.int64)
    valid = p >= 0
    pc = tl.maximum(p, 0)
    lp = pc // bs
    off = pc % bs
    if HAS_RES:
        page = tl.load(res_ptr + r * res_s + lp, mask=valid, other=-1).to(tl.int64)
        resident = valid & (page >= 0)
        rid = page * bs + off
    else:
        resident = p < -1
        rid = pc
    return r, P, p, valid, lp, off, resident, rid


@triton.jit
def _stage_chunk(sel_ptr, sel_n, rows_ptr, pos_ptr, res_ptr, res_s, idx_tab_ptr, idx_tab_s, sof_ptr, src_tab_ptr,
                 src_tab_s, src_ptr, stage_ptr, cnt_ptr, n, c, K, W, bs, fast_limit, HAS_RES: tl.constexpr,
                 COPY_J: tl.constexpr, BLOCK_W: tl.constexpr):
    """Staging program c of request n: positions j in [c*COPY_J, (c+1)*COPY_J) classified as the resolve does;
    each miss's host row copied to staging row n*K + j. The request's done-count goes up by one as soon as the
    reverse-map reads are done (release: they happen before the resolve's writes), before the copy: the resolve
    never touches host or staging rows, so its tail runs beside the copy."""
    oj = c * COPY_J + tl.arange(0, COPY_J)
    r, P, p, valid, lp, off, resident, _ = _selected(sel_ptr, sel_n, rows_ptr, pos_ptr, res_ptr, res_s, n, oj,
                                                     oj < K, bs, HAS_RES)
    if P >= fast_limit:  # a fast-path row (hisparse, P < B) looks nothing up and misses nothing
        look = valid & (~resident) & (p != P)  # the resolve's lookups: not resident, not the newest token
        # table loads unmasked: every lane's page index is in range (pc >= 0), its value used only where it misses
        ipage = tl.load(idx_tab_ptr + r * idx_tab_s + lp).to(tl.int64)
        miss = look & (tl.load(sof_ptr + ipage * bs + off, mask=look, other=0) < 0)
        srow = tl.load(src_tab_ptr + r * src_tab_s + lp).to(tl.int64) * bs + off
        tl.atomic_add(cnt_ptr + n, 1, sem="release")
        _copy_rows(src_ptr, srow, stage_ptr, n * K + oj, miss, W, BLOCK_W)
    else:
        tl.atomic_add(cnt_ptr + n, 1, sem="release")


@triton.jit
def _stage_join(cnt_ptr, STAGE: tl.constexpr):
    """The resolve program waits until all STAGE staging programs of its request have read the reverse map, then
    re-arms the count for the next call (every increment of this call has landed)."""
    while tl.atomic_add(cnt_ptr, 0, sem="acquire") < STAGE:
        pass
    tl.atomic_xchg(cnt_ptr, 0)


@triton.jit
def _copy_plan(plan_ptr, dst_ptr, src_ptr, dev_ptr, start, m, stride, W, COPY_J: tl.constexpr,
               BLOCK_W: tl.constexpr):
    """Copy plan rows [start, m) in chunks of COPY_J taken every `stride` chunks: src row plan[j] →
    device row dst[j], W values each."""
    for j0 in range(start * COPY_J, m, stride * COPY_J):
        oj = j0 + tl.arange(0, COPY_J)
        jm = oj < m
        sr = tl.load(plan_ptr + oj, mask=jm, other=0)
        dr = tl.load(dst_ptr + oj, mask=jm, other=0)
        _copy_rows(src_ptr, sr, dev_ptr, dr, jm, W, BLOCK_W)


@triton.jit
def _copy_rows(src_ptr, sr, dst_ptr, dr, rm, W, BLOCK_W: tl.constexpr):
    """Rows sr -> rows dr where rm, W values each, BLOCK_W columns per step."""
    for w0 in range(0, W, BLOCK_W):
        ow = w0 + tl.arange(0, BLOCK_W)
        cm = rm[:, None] & (ow < W)[None, :]
        x = tl.load(src_ptr + sr[:, None] * W + ow[None, :], mask=cm)
        tl.store(dst_ptr + dr[:, None] * W + ow[None, :], x, mask=cm)


@triton.jit
def _copy_misses_kernel(plan_ptr, vict_ptr, nmiss_ptr, src_ptr, dev_ptr, K, W, SPLIT,
                        COPY_J: tl.constexpr, BLOCK_W: tl.constexpr):
    """Second launch of the split path: SPLIT programs per request share its missed rows (chunk c
    goes to program c % SPLIT), so even one request's misses spread over many SMs. Grid (SPLIT, requests):
    programs launched together copy one request's rows, whose host pages sit together — with the request
    as the fast grid axis, 128 requests' rows interleaved ran at 0.46-0.60x a plain gather of the same
    scattered rows (H200, benchmarks.kv_resolve: host-pool page-translation locality, presumably)."""
    c = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    m = tl.load(nmiss_ptr + n)
    _copy_plan(plan_ptr + n * K, vict_ptr + n * K, src_ptr, dev_ptr, c, m, SPLIT, W, COPY_J, BLOCK_W)


CONFIG_KEYS = ("num_warps", "copy_j", "split", "block_w", "stage", "stage_j")
# the stage path for at most this many request rows per call: up to 8 rows it hides the resolve before the copy,
# at 32 rows it no longer wins (docs/tuning/kv_resolve.md)
STAGE_MAX_ROWS = 8


class ResolveScratch:
    """Fixed-address scratch of the kernel (victim list, copy plan, hit marks, staging counts; the staging rows of
    the stage path, allocated on first use), reused every call so a captured CUDA graph stays valid. Marks and
    counts are left zeroed by every call."""

    def __init__(self, max_rows: int, k: int, num_slots: int, b: int, device):
        self.stage_rows = min(max_rows, STAGE_MAX_ROWS) * k   # every call the stage path takes by default
        self.vict = torch.empty(max_rows, k, dtype=torch.int64, device=device)
        self.plan = torch.empty(max_rows, k, dtype=torch.int64, device=device)
        self.mark = torch.zeros(num_slots, b, dtype=torch.int32, device=device)
        self.count = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self._staging = None

    def staging(self, rows: int, w: int, dtype) -> torch.Tensor:
        """[>= rows, w] staging rows: on first use as many as the largest default stage-path call needs, so the
        calls of every batch bucket (each captured in its own graph) share one buffer that never moves; grown
        only for a larger explicit `stage=True` call (never shrunk)."""
        st = self._staging
        if st is None or st.shape[0] < rows or st.shape[1] != w or st.dtype != dtype:
            self._staging = st = torch.empty(max(rows, self.stage_rows), w, dtype=dtype, device=self.vict.device)
        return st


def kv_resolve_triton(sel, rows, pos, res_table, hot_table, hot_pos, lru, idx_table, slot_of, src_table, src,
                      dev, block_size: int, fast_path: bool, ids=None, n_miss=None, scratch=None,
                      num_warps: int | None = None, copy_j: int = 8, split: int | None = None,
                      block_w: int | None = None, stage: bool | None = None, stage_j: int = 16):
    """split: programs per request for the miss copy (a second launch); 0 = copy inside the resolve
    program. Default: one program per copy_j-row chunk on the (chunk, request) grid (it brings the large-batch copy
    level with a plain gather; docs/tuning/kv_resolve.md). block_w: columns per copy step (default the row, up to 1024).
    stage: the host copy starts beside the resolve instead of after it — cdiv(K, stage_j) staging programs per
    request copy its missed rows (stage_j each) to device staging rows while the resolve program assigns
    victims, and the second launch copies staging → hot rows on the device (see `_resolve_kernel`); default
    for at most STAGE_MAX_ROWS request rows, where the resolve's ~16 µs otherwise precede the copy."""
    N, K = sel.shape
    S, B = lru.shape
    W = dev.shape[-1]
    if ids is None:
        ids = torch.empty(N, K, dtype=torch.int32, device=sel.device)
    if n_miss is None:
        n_miss = torch.empty(N, dtype=torch.int32, device=sel.device)
    if N == 0:
        return ids, n_miss
    if scratch is None:
        scratch = ResolveScratch(N, K, S, B, sel.device)
    BLOCK_B = triton.next_power_of_2(B)
    if num_warps is None:
        num_warps = max(4, min(16, BLOCK_B // 256))
    if split is None:  # one chunk per program, as copy_rows: programs without a chunk exit after one load
        split = triton.cdiv(K, copy_j)
    if stage is None:
        stage = N <= STAGE_MAX_ROWS and split > 0
    if stage and split == 0:
        raise ValueError("config: stage=True copies staging rows in the second launch; it needs split > 0")
    if block_w is None:  # the whole row in one step (MLA rows: 656 B fp8 / 1152 B bf16)
        block_w = min(1024, triton.next_power_of_2(W))
    has_res = res_table is not None
    res = res_table if has_res else hot_table  # unused pointer when HAS_RES is off
    n_stage = triton.cdiv(K, stage_j) if stage else 0
    staging = scratch.staging(N * K, W, src.dtype) if stage else dev
    _resolve_kernel[(n_stage + 1, N) if stage else (N,)](
        sel, sel.stride(0), rows, pos,
        res, res.stride(0), hot_table, hot_table.stride(0), hot_pos, hot_pos.stride(0), lru, lru.stride(0),
        idx_table, idx_table.stride(0), slot_of, src_table, src_table.stride(0), src, dev,
        ids, ids.stride(0), n_miss, scratch.vict, scratch.plan, scratch.mark, scratch.mark.stride(0),
        staging, scratch.count,
        K, B, W, block_size, B if fast_path else 0,
        HAS_RES=has_res, BLOCK_K=triton.next_power_of_2(K), BLOCK_B=BLOCK_B,
        COPY_J=stage_j if stage else copy_j, BLOCK_W=block_w, FUSED_COPY=split == 0, STAGE=n_stage,
        num_warps=num_warps)
    if split:
        _copy_misses_kernel[(split, N)](scratch.plan, scratch.vict, n_miss, staging if stage else src, dev, K, W,
                                        split, COPY_J=copy_j, BLOCK_W=block_w, num_warps=4)
    return ids, n_miss
