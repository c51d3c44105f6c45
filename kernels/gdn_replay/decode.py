"""Gated DeltaNet ReplaySSM decode step, per-head: shaped like the Mamba-2 per-head kernel so it can stream.

One program per (V-tile x value head, batch row), grid ``(HV * cdiv(V, BLOCK_V), batch)``, tile
[BLOCK_V, K] of the checkpoint (or of its low-precision copy in dual precision), chosen by
``pick_decode_config``. T = 1, ``advance=False`` only: write_pos is read, never written (the caller moves
the shared cursor once per step with ``replay_advance``).

Latency layout (as in ``mamba2_replay.decode``): nothing but the slot id sits in front of the
loads. The checkpoint tile, all L ring entries (u tile, the key head's k, g) and this token's inputs
are issued without waiting for the cursor; the cursor is one scalar used only in arithmetic (entries
j >= wp are zeroed with ``where``: stale ring contents may be NaN). A split step's output-only launch instead
reads the cursor after issuing the tile and loads only entries j < wp (``ring_by_cursor``: half the ring bytes
on average; in a fused step the wait cost more than it saved, measured). With Gam_j = cumsum(ring g)_j and
G_t = sum(ring g) + g_t, and k, q L2-normalised (q times scale):
  * output-only (adjoint) route, wp < L-1:
      S k  = e^{G_t} (S0 k) + sum_{j<wp} e^{G_t - Gam_j} (k_j . k) u_j      (S q likewise)
      u_t  = beta (v - S k);  o = S q + u_t (k . q);  (u_t, k, g_t) appended at ring position wp
      (u tile by every program, g by V-tile 0, k by V-tile 0 of the key head's first value head).
  * flush, wp >= L-1: the ring replayed serially on the fp32 checkpoint tile (the eager order),
    S_t = e^{g_t} S + u_t k^T, written to ckpt (+ ckpt_lo), o = S_t q; nothing appended.
A split step's output-only launch (``ring_dots``, the default there) takes k, q, k . q and the ring's k_j . k,
k_j . q from the verify prologue run at T = 1, once per (row, key head), instead of every (value head, V-tile)
program reading the [L, K] key ring (55-58 fewer registers in the output-only launch; see
``replay_common.ring_dots_default``).
Config: ``(BLOCK_V, num_warps[, fold[, maxnreg]])``; fold = how a flush folds the ring: "serial" rank-1
updates, or one fp32 ``tl.dot`` over the ring ("dot", FMA; "tf32x3", tensor cores; "bf16x3" with a bf16 k ring:
three bf16 parts of the decayed u on bf16 tensor cores) as in the Mamba-2 kernel
(default: ``pick_fold``); maxnreg caps registers per thread.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import _tl
from .. import replay_common as rc
from .._tl import (
    _fold_bf16x3,
    _load_state,
    _ring_mask,
    _round_bf16,
    _serial_fold,
    _slot_of,
    _store_tile,
    _tile_mask,
)
from ..replay_common import FOLDS, is_fp8
from .verify import _gdn_verify_keys_kernel


@triton.jit
def _gdn_replay_decode_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    ru_ptr, rk_ptr, rg_ptr, wp_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, sid_ptr, kq_ptr,
    sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbt_b, sbt_h, so_b, so_h, scale,
    HV: tl.constexpr, Hk: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, USE_L2: tl.constexpr,
    CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, ROUND_RU: tl.constexpr, ROUND_RK: tl.constexpr,
    ROUND_OUT: tl.constexpr, FOLD: tl.constexpr, ROUTE: tl.constexpr, TPP: tl.constexpr = 1,
    RING_BY_CURSOR: tl.constexpr = False, DOTS: tl.constexpr = False, RW: tl.constexpr = 1, TP: tl.constexpr = 2,
):
    """ROUTE 0: every row (both routes, one kernel); 1: output-only rows only (a flushing row is left
    alone: no output, no append); 2: flushing rows only, TPP (value head, V-tile)s per program, grid
    (cdiv(HV * V-tiles, TPP), batch): the cursor is read first and a program of a non-flushing row exits
    (as in ``mamba2_replay.decode``). RING_BY_CURSOR (routes 0, 1): the cursor is read right after the
    checkpoint tile is issued and ring entries at or past it are never read (a plain step reads wp entries,
    not L); route 1 then also skips a flushing row before its tile. DOTS (routes 0, 1): the key-head
    quantities come from the prologue's record at kq_ptr (``verify._gdn_verify_keys_kernel`` with T = 1,
    which also appended k), so the [L, K] key ring is read only by a flush that folds it as a dot."""
    REP: tl.constexpr = HV // Hk
    if ROUTE == 2:
        NUM_T: tl.constexpr = (V + BV - 1) // BV
        row = tl.program_id(1).to(tl.int64)
        slot, valid = _slot_of(sid_ptr, row)
        if valid & (tl.load(wp_ptr + slot, mask=valid, other=0) >= L - 1):
            for i in range(TPP):
                tile = tl.program_id(0) * TPP + i
                if tile < HV * NUM_T:
                    hv = tile // NUM_T
                    _gdn_decode_row(ck_ptr, cks_ptr, lo_ptr, los_ptr, ru_ptr, rk_ptr, rg_ptr, wp_ptr,
                                       q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, kq_ptr,
                                       sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbt_b, sbt_h, so_b, so_h,
                                       scale, row, hv, tile % NUM_T, hv // REP, slot, valid, HV, Hk, V, K, L, LP,
                                       BV, BK, USE_L2, CK_FP8, HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, ROUND_RU,
                                       ROUND_RK, ROUND_OUT, FOLD, ROUTE, False, False, RW, TP)
    else:
        row, hv, vt, hk = _tl._head_tile(V, BV, REP)
        slot, valid = _slot_of(sid_ptr, row)
        run = True
        if ROUTE == 1 and RING_BY_CURSOR:  # padding rows run (they write zeros)
            run = tl.where(valid, tl.load(wp_ptr + slot, mask=valid, other=0), 0) < L - 1
        if run:
            _gdn_decode_row(ck_ptr, cks_ptr, lo_ptr, los_ptr, ru_ptr, rk_ptr, rg_ptr, wp_ptr,
                               q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, kq_ptr,
                               sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbt_b, sbt_h, so_b, so_h, scale,
                               row, hv, vt, hk, slot, valid, HV, Hk, V, K, L, LP, BV, BK, USE_L2, CK_FP8, HAS_LO,
                               LO_FP8, ROUND_CK, ROUND_LO, ROUND_RU, ROUND_RK, ROUND_OUT, FOLD, ROUTE, RING_BY_CURSOR,
                               DOTS, RW, TP)


@triton.jit
def _gdn_decode_row(
    ck_ptr, cks_ptr, lo_ptr, los_ptr, ru_ptr, rk_ptr, rg_ptr, wp_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, kq_ptr,
    sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbt_b, sbt_h, so_b, so_h, scale,
    row, hv, vt, hk, slot, valid,
    HV: tl.constexpr, Hk: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, USE_L2: tl.constexpr,
    CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, ROUND_RU: tl.constexpr, ROUND_RK: tl.constexpr,
    ROUND_OUT: tl.constexpr, FOLD: tl.constexpr, ROUTE: tl.constexpr, RING_BY_CURSOR: tl.constexpr,
    DOTS: tl.constexpr, RW: tl.constexpr, TP: tl.constexpr,
):
    REP: tl.constexpr = HV // Hk
    KEYS: tl.constexpr = DOTS and ROUTE != 2  # key-head quantities from the prologue's record

    # masks from scalar limits; the K axis is masked only when K is not a power of two
    offs_v, offs_k, offs_l, vm, km, rl = _tl._limit_masks(vt, valid, V, BV, K, BK, L, LP)
    tile_mask = _tile_mask(vm, km, K, BK)
    st_off = offs_v[:, None] * K + offs_k[None, :]
    sh = slot * HV + hv                            # (slot, value head)
    skh = slot * Hk + hk                           # (slot, key head)

    # ---- 1) the step's big read: checkpoint tile (or its low-precision copy; a flush-only launch reads
    #         the fp32 checkpoint straight away) ----
    if HAS_LO and ROUTE != 2:
        S0 = _load_state(lo_ptr + sh * V * K, los_ptr + sh * V, st_off, tile_mask, offs_v, vm, LO_FP8)
    else:
        S0 = _load_state(ck_ptr + sh * V * K, cks_ptr + sh * V, st_off, tile_mask, offs_v, vm, CK_FP8)
    # ---- 2) the ring: all L entries with no cursor dependency, or (RING_BY_CURSOR) only the wp written ones,
    #         which waits one scalar load but moves on average half the ring bytes ----
    if RING_BY_CURSOR:
        wp = tl.load(wp_ptr + slot, mask=valid, other=0)
        rl = rl & (offs_l < wp)
    rk_mask = _tile_mask(rl, km, K, BK)
    ru_mask = _ring_mask(rl, vm, V, BV)           # the ring u tile [LP, BV]
    ru_base = ru_ptr + sh * L * V
    rk_base = rk_ptr + skh * L * K
    rg_base = rg_ptr + sh * L
    ru_raw = tl.load(ru_base + offs_l[:, None] * V + offs_v[None, :], mask=ru_mask, other=0.0)
    if KEYS:  # record (verify's layout): [k (BK) | q (BK) | k_j . k (LP) | k_j . q (LP) | 2 x TP unused | k . q]
        rec = kq_ptr + (row * Hk + hk) * RW
        dk = tl.load(rec + 2 * BK + offs_l)
        dq = tl.load(rec + 2 * BK + LP + offs_l)
        rk_raw = dk  # not read (the key ring stays in memory)
    else:
        rk_raw = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :], mask=rk_mask, other=0.0)
    rg_raw = tl.load(rg_base + offs_l, mask=rl, other=0.0)
    # ---- 3) cursor (one scalar) and this token's inputs ----
    if not RING_BY_CURSOR:
        wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    # k stays in its load dtype until the compute below: converting it here puts a wait for the load in front of
    # the v / g / beta loads (measurably slower at batch 1; docs/tuning/replay.md)
    if KEYS:  # normalised (q scaled) by the prologue
        kt_raw = tl.load(rec + offs_k)
        qt = tl.load(rec + BK + offs_k)
        kq = tl.load(rec + 2 * BK + 2 * LP + 2 * TP)
    else:
        kt_raw = tl.load(k_ptr + row * sk_b + hk * sk_h + offs_k, mask=km, other=0.0)
        qt = tl.load(q_ptr + row * sq_b + hk * sq_h + offs_k, mask=km, other=0.0).to(tl.float32)
    vt_ = tl.load(v_ptr + row * sv_b + hv * sv_h + offs_v, mask=vm, other=0.0).to(tl.float32)
    gt = tl.load(g_ptr + row * sg_b + hv * sg_h).to(tl.float32)
    bt = tl.load(beta_ptr + row * sbt_b + hv * sbt_h).to(tl.float32)

    # ---- compute: ring entries j >= wp masked in arithmetic (where, not *0: stale entries may be NaN) ----
    kt = kt_raw.to(tl.float32)
    if not KEYS:
        if USE_L2:
            kt = kt / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
            qt = qt / tl.sqrt(tl.sum(qt * qt, axis=0) + 1e-6)
        qt = qt * scale
    lm = offs_l < wp                               # wp = 0 on a padding row
    rg = tl.where(lm, rg_raw, 0.0)
    Gam = tl.cumsum(rg, axis=0)
    Gt = tl.sum(rg, axis=0) + gt
    flush = valid & (wp >= L - 1)
    if ROUTE == 1:
        if not KEYS:
            dk, dq, kq = _ring_dots(rk_raw, lm, kt, qt)
        ut, ot = _gdn_output_only(S0, ru_raw, dk, dq, kq, lm, Gt, Gam, kt, qt, vt_, bt)
    elif ROUTE == 2:
        ut, ot = _gdn_flush(S0, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ru_raw, rk_raw, lm, Gt, Gam,
                            gt, bt, vt_, kt, qt, ru_base, rk_base, rg_base, wp, offs_v, offs_k, vm, km, V, K, L,
                            CK_FP8, HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, FOLD)
    else:
        if flush:
            # serial replay on the fp32 checkpoint (dual precision: S0 above was the copy)
            if HAS_LO:
                S = _load_state(ck_ptr + sh * V * K, cks_ptr + sh * V, st_off, tile_mask, offs_v, vm, CK_FP8)
            else:
                S = S0
            if KEYS and FOLD != 0:  # a dot fold reads the key ring as a tile (a new name: rk_raw is the record's)
                rk_fold = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :], mask=rk_mask, other=0.0)
            else:
                rk_fold = rk_raw
            ut, ot = _gdn_flush(S, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ru_raw, rk_fold, lm, Gt,
                                Gam, gt, bt, vt_, kt, qt, ru_base, rk_base, rg_base, wp, offs_v, offs_k, vm, km, V, K,
                                L, CK_FP8, HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, FOLD)
        else:
            if not KEYS:
                dk, dq, kq = _ring_dots(rk_raw, lm, kt, qt)
            ut, ot = _gdn_output_only(S0, ru_raw, dk, dq, kq, lm, Gt, Gam, kt, qt, vt_, bt)
    # ---- append at ring position wp (output-only route of a real row) ----
    app = valid & (wp < L - 1)
    wpa = tl.where(app, wp, 0)
    ut_st = ut
    kt_st = kt
    if ROUND_RU:
        ut_st = _round_bf16(ut)
    if ROUND_RK:
        kt_st = _round_bf16(kt)
    tl.store(ru_base + wpa * V + offs_v, ut_st.to(ru_ptr.dtype.element_ty), mask=offs_v < tl.where(app, V, 0))
    tl.store(rg_base + wpa, gt, mask=app & (vt == 0))
    if not KEYS:  # (the prologue appended k)
        k_writer = app & (vt == 0) & ((hv % REP) == 0)
        tl.store(rk_base + wpa * K + offs_k, kt_st.to(rk_ptr.dtype.element_ty),
                 mask=offs_k < tl.where(k_writer, K, 0))
    # ---- output ----
    ot = tl.where(valid, ot, 0.0)
    if ROUND_OUT:
        ot = _round_bf16(ot)
    if ROUTE == 1:  # a plain-only launch leaves a flushing row to the flush launch
        om = offs_v < tl.where(flush, 0, V)
    else:
        om = offs_v < V
    tl.store(o_ptr + row * so_b + hv * so_h + offs_v, ot.to(o_ptr.dtype.element_ty), mask=om)


@triton.jit
def _gdn_flush(S, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ru_raw, rk_raw, lm, Gt, Gam, gt, bt, vt_,
               kt, qt, ru_base, rk_base, rg_base, wp, offs_v, offs_k, vm, km, V: tl.constexpr, K: tl.constexpr,
               L: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
               ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, FOLD: tl.constexpr):
    """Flush: the ring folded into the fp32 checkpoint S, this token's delta rule, S_t written to ckpt (and the
    copy); returns (u_t, o)."""
    if FOLD == 0:
        S = _serial_fold(S, ru_base + offs_v, rk_base + offs_k, rg_base, V, K, wp, 1.0, vm, km, L, False)
    else:
        # S_wp = e^{Gam_wp} S + sum_{j<wp} e^{Gam_wp - Gam_j} u_j k_j^T as one [BV, LP] x [LP, BK] dot over
        # the ring already in registers (fp32 FMA "dot" or 3-pass tf32 "tf32x3")
        wj = tl.where(lm, tl.exp(Gt - gt - Gam), 0.0)
        uw = tl.trans(tl.where(lm[:, None], ru_raw.to(tl.float32), 0.0) * wj[:, None])        # [BV, LP]
        rkf = tl.where(lm[:, None], rk_raw.to(tl.float32), 0.0)                                # [LP, BK]
        if FOLD == 1:
            S = tl.exp(Gt - gt) * S + tl.dot(uw, rkf, input_precision="ieee")
        elif FOLD == 3:  # bf16 tensor cores, the decayed checkpoint as the accumulator (a bf16 k ring)
            S = _fold_bf16x3(tl.exp(Gt - gt) * S, uw, rkf)
        else:
            S = tl.exp(Gt - gt) * S + tl.dot(uw, rkf, input_precision="tf32x3")
    S = tl.exp(gt) * S
    ut = bt * (vt_ - tl.sum(S * kt[None, :], axis=1))
    S = S + ut[:, None] * kt[None, :]
    _store_tile(ck_ptr + sh * V * K, cks_ptr + sh * V, st_off, S, offs_v, vm, tile_mask, CK_FP8, ROUND_CK)
    if HAS_LO:
        _store_tile(lo_ptr + sh * V * K, los_ptr + sh * V, st_off, S, offs_v, vm, tile_mask, LO_FP8, ROUND_LO)
    return ut, tl.sum(S * qt[None, :], axis=1)


@triton.jit
def _ring_dots(rk_raw, lm, kt, qt):
    """The key-head quantities in the program: k_j . k and k_j . q over the ring [LP] (0 past the cursor), k . q."""
    rk = tl.where(lm[:, None], rk_raw.to(tl.float32), 0.0)                   # [LP, BK]
    return tl.sum(rk * kt[None, :], axis=1), tl.sum(rk * qt[None, :], axis=1), tl.sum(kt * qt, axis=0)


@triton.jit
def _gdn_output_only(S0, ru_raw, dk, dq, kq, lm, Gt, Gam, kt, qt, vt_, bt):
    """Adjoint route: S k and S q from S0, the ring u tile and the ring's key dot products dk / dq (and k . q),
    then the delta rule's u_t; returns (u_t, o)."""
    ru = tl.where(lm[:, None], ru_raw.to(tl.float32), 0.0)                   # [LP, BV]
    er = tl.where(lm, tl.exp(Gt - Gam), 0.0)
    wk = er * dk                                                               # [LP]
    wq = er * dq
    eG = tl.exp(Gt)
    Sk = eG * tl.sum(S0 * kt[None, :], axis=1) + tl.sum(wk[:, None] * ru, axis=0)
    Sq = eG * tl.sum(S0 * qt[None, :], axis=1) + tl.sum(wq[:, None] * ru, axis=0)
    ut = bt * (vt_ - Sk)
    return ut, Sq + ut * kq


def pick_decode_config(batch: int, HV: int, V: int, lo: bool) -> tuple[int, int]:
    """(BLOCK_V, num_warps): a [32, K] tile on one warp (128 elements per thread, the Mamba-2 winner's load per
    thread) once batch x heads fills the GPU (>= 1024 rows); below, where the flush folds with the fp32 dot
    (`pick_fold`), [16, K] tiles on 2 warps up to 64 rows, on one warp above. See docs/tuning/replay.md."""
    cap = triton.next_power_of_2(V)
    rows = batch * HV
    if rows >= 1024:
        return min(32, cap), 1
    return min(16, cap), 2 if rows <= 64 else 1


def pick_fold(ckpt_lo, BV: int, nw: int, rows: int, ring_k_dtype=torch.bfloat16) -> str:
    """How a flush folds the ring. Below 1024 rows (batch x value heads) the step is latency-bound: the fp32 FMA
    dot over the ring already in registers, not L dependent rank-1 updates. From 1024 rows: fp32 serial (the fused
    kernel's registers: bf16x3 spills there); a bf16 copy at (32, 1) bf16x3 with a bf16 k ring (exact in bf16),
    else the dot. See docs/tuning/replay.md."""
    if rows < 1024:
        return "dot"
    if ckpt_lo is not None and ckpt_lo.dtype == torch.bfloat16 and (BV, nw) == (32, 1):
        return "bf16x3" if ring_k_dtype == torch.bfloat16 else "dot"
    return "serial"


def split_default(ckpt_lo, rows: int) -> bool:
    """Two launches (output-only rows, then flushing rows), as `mamba2_replay.decode.split_default`: the fused
    dual kernel spills, its output-only path does not. For a low-precision copy at rows = batch x value heads
    >= 4096: below, the prologue launch and the fork / join cost more than the kernel gains; fp32 stays fused
    (the flush launch costs more than the registers save). See docs/tuning/replay.md."""
    return ckpt_lo is not None and rows >= 4096


def launch_decode(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, *, L, scale,
                     use_qk_l2norm, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, config=None, split=None,
                     flush_config=None, ring_by_cursor: bool | None = None, ring_dots: bool | None = None,
                     overlap: bool | None = None):
    """q/k [b,Hk,K], v [b,HV,V], g/beta [b,HV], o [b,HV,V] (written). Inner strides 1.
    split: None = `split_default`; True = output-only launch (config) + flush launch (`resolve_flush_config`),
    False = one fused launch (config). ring_by_cursor: the fused / output-only launch reads the cursor before
    the ring and never reads entries at or past it (kernel RING_BY_CURSOR);
    None = `replay_common.ring_by_cursor_default`. ring_dots: the key-head prologue first (kernel DOTS);
    None = `replay_common.ring_dots_default` (on for a split step). overlap (split, CUDA): the flush launch
    on a high-priority side stream beside the output-only launch; None = `replay_common.overlap_default`."""
    slots, HV, V, K = ckpt.shape
    Hk = ring_k.shape[1]
    b = slot_ids.shape[0]
    if b == 0:
        return o
    bv, nw, fold, maxnreg = rc.decode_config(
        config, pick_decode_config(b, HV, V, ckpt_lo is not None),
        lambda block, warps: pick_fold(ckpt_lo, block, warps, b * HV, ring_k.dtype))
    if split is None:
        split = split_default(ckpt_lo, b * HV)
    if ring_by_cursor is None:
        ring_by_cursor = rc.ring_by_cursor_default(split)
    if ring_dots is None:
        ring_dots = rc.ring_dots_default(split)
    # 4 tiles per program: with staggered cursors (1/L of the rows flush each step) 16 put the flush on a few long
    # programs; rows per program instead never beat tiles per program (docs/tuning/replay.md)
    fbv, fnw, ffold, tpp = rc.resolve_flush_config(flush_config, bv, nw, fold, 4)
    if "bf16x3" in (fold, ffold if split else None) and ring_k.dtype != torch.bfloat16:
        raise ValueError(f"config: fold 'bf16x3' needs a bf16 k ring (exact in bf16), got {ring_k.dtype}")
    extra = {} if maxnreg is None else {"maxnreg": int(maxnreg)}
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    low = (torch.bfloat16, torch.float8_e4m3fn)
    dummy = ckpt
    sc = float(K ** -0.5 if scale is None else scale)
    LP, BK = max(16, triton.next_power_of_2(L)), triton.next_power_of_2(K)
    TP = 2  # the prologue's window width at T = 1 (verify: max(2, T))
    RW = 2 * BK + 2 * LP + 4 * TP  # its record, as verify lays it out
    kq = dummy
    if ring_dots:
        kq = torch.empty(b, Hk, RW, dtype=torch.float32, device=v.device)
        _gdn_verify_keys_kernel[(Hk, b)](
            ring_k, write_pos, q, k, slot_ids, kq, q.stride(0), 0, q.stride(1), k.stride(0), 0, k.stride(1), sc,
            Hk=Hk, K=K, L=L, T=1, TP=TP, LP=LP, BK=BK, RW=RW, USE_L2=bool(use_qk_l2norm),
            ROUND_RK=interp and ring_k.dtype == torch.bfloat16, ROOM=L - 1, num_warps=4 if BK >= 128 else 2)
    args = (ckpt, ckpt_scale if ckpt_scale is not None else dummy,
            ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
            ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, o, slot_ids, kq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), o.stride(0), o.stride(1), sc)
    meta = dict(HV=HV, Hk=Hk, V=V, K=K, L=L, LP=LP, BK=BK, USE_L2=bool(use_qk_l2norm), DOTS=bool(ring_dots), RW=RW,
                TP=TP,
                CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
                ROUND_CK=interp and ckpt.dtype in low,
                ROUND_LO=interp and ckpt_lo is not None and ckpt_lo.dtype in low,
                ROUND_RU=interp and ring_u.dtype == torch.bfloat16, ROUND_RK=interp and ring_k.dtype == torch.bfloat16,
                ROUND_OUT=interp and o.dtype == torch.bfloat16)
    grid = (HV * triton.cdiv(V, bv), b)
    if not split:
        _gdn_replay_decode_kernel[grid](*args, **meta, BV=bv, FOLD=FOLDS[fold], ROUTE=0, num_warps=nw,
                                           RING_BY_CURSOR=bool(ring_by_cursor), **extra)
        return o

    def output_only():
        _gdn_replay_decode_kernel[grid](*args, **meta, BV=bv, FOLD=FOLDS[fold], ROUTE=1, num_warps=nw,
                                           RING_BY_CURSOR=bool(ring_by_cursor), **extra)

    def flush():
        _gdn_replay_decode_kernel[(triton.cdiv(HV * triton.cdiv(V, fbv), tpp), b)](
            *args, **meta, BV=fbv, FOLD=FOLDS[ffold], ROUTE=2, TPP=tpp, num_warps=fnw)

    # the two launches touch disjoint rows (by cursor), so their order is free and they may run side by side
    rc.run_split(v.device, output_only, flush, rc.overlap_default(split) if overlap is None else overlap)
    return o
