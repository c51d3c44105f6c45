"""Mamba-2 ReplaySSM decode step, per-head: shaped like the eager ``mamba2_decode`` kernel so it can stream.

One program per (P-tile x head, batch row), grid ``(H * cdiv(P, BLOCK_P), batch)``, tile
[BLOCK_P, N] chosen by ``pick_decode_config`` (more tile elements per thread than the eager kernel: a
read-only step needs more bytes in flight), read every step: the checkpoint, or its low-precision
copy in dual precision. T = 1, ``advance=False`` only:
write_pos is read, never written (the caller moves the shared cursor once per step).

Latency layout: nothing but the slot id sits in front of the loads. The checkpoint tile, all L ring
entries (x tile, dt, the group's B) and this token's inputs are issued without waiting for the
cursor; the cursor is one scalar load used only in arithmetic (entries j >= wp are zeroed with
``where``, so stale or NaN ring contents never leak in). A split step's output-only launch instead reads the
cursor after issuing the tile and loads only entries j < wp (``ring_by_cursor``: half the ring bytes on
average; in a fused step the wait cost more than it saved, measured). Then, with c_j = A * cumsum(dt)_j and
c_t = A * (sum of ring dt + dt_t):
  * output-only route (wp < L-1): y = e^{c_t} (S0 . C_t) + sum_{j<wp} dt_j e^{c_t-c_j} (B_j . C_t) x_j
    + dt_t (B_t . C_t) x_t + D x_t (* silu(z)); this token is appended at ring position wp (x tile by
    every program, dt by P-tile 0, B by P-tile 0 of the group's first head).
  * state route (wp >= L-1): S_t = e^{c_t} S0 + sum_{j<wp} dt_j e^{c_t-c_j} x_j B_j^T + dt_t x_t B_t^T
    from the fp32 checkpoint; written to ckpt (+ ckpt_lo; fp8 with one scale per (head, p) row),
    nothing appended, y = S_t . C_t + D x_t (* silu(z)). The ring sum is serial rank-1 updates by
    default, or one [BP, L] x [L, N] ``tl.dot`` (fp32 "dot" / "tf32x3" / "bf16x3"): see ``pick_fold``.
A split step's output-only launch (``ring_dots``, the default there) takes B_j . C_t and B_t . C_t from the verify
gram prologue run at T = 1, once per (row, group), instead of every (head, P-tile) program reading the [L, N] B
ring (see ``replay_common.ring_dots_default``).
Config: ``(BLOCK_P, num_warps[, fold[, maxnreg]])``; the N axis is masked only when N is not a power of two.
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
    _slot_of,
    _softplus,
    _store_tile,
    _tile_mask,
)
from ..replay_common import FOLDS, is_fp8, split_default
from .verify import _mamba2_verify_gram_kernel


@triton.jit
def _fold_ring(S, ct, wr, xr, rB, rdt_base, rx_base, rB_base, A_h, wp, offs_p, offs_n, pm, nm,
               P: tl.constexpr, N: tl.constexpr, L: tl.constexpr, FOLD: tl.constexpr):
    """S_t before this token: e^{c_t} S0 + the ring's rank-1 terms (see pick_decode_config for the folds)."""
    if FOLD == 1:    # one fp32 dot over the ring: [BP, LP] x [LP, BN] (FMA; ~190 regs)
        S = tl.exp(ct) * S + tl.dot(tl.trans(wr[:, None] * xr), rB, input_precision="ieee")
    elif FOLD == 2:  # the same on tensor cores, 3-pass tf32 (~fp32 accuracy; 95-115 regs)
        S = tl.exp(ct) * S + tl.dot(tl.trans(wr[:, None] * xr), rB, input_precision="tf32x3")
    elif FOLD == 3:  # bf16 tensor cores, the decayed checkpoint as the accumulator (see _fold_bf16x3)
        S = _fold_bf16x3(tl.exp(ct) * S, tl.trans(wr[:, None] * xr), rB)
    else:            # serial rank-1 updates, ring rows re-read (L1/L2-hot): 79 regs, eager has 80
        S = tl.exp(ct) * S
        run = ct * 0.0
        # next entry prefetched: two in flight, +1 register
        dj = tl.load(rdt_base)
        xj = tl.load(rx_base + offs_p, mask=pm, other=0.0)
        bj = tl.load(rB_base + offs_n, mask=nm, other=0.0)
        for j in range(0, wp):
            jn = tl.minimum(j + 1, L - 1)  # in bounds; unused after the last entry
            dn = tl.load(rdt_base + jn)
            xn = tl.load(rx_base + jn * P + offs_p, mask=pm, other=0.0)
            bn = tl.load(rB_base + jn * N + offs_n, mask=nm, other=0.0)
            run += dj
            S += ((dj * tl.exp(ct - A_h * run)) * xj.to(tl.float32))[:, None] * bj.to(tl.float32)[None, :]
            dj = dn
            xj = xn
            bj = bn
    return S


@triton.jit
def _mamba2_replay_decode_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr, sid_ptr, rwp_ptr, bc_ptr,
    sx_b, sx_h, sz_b, sz_h, sy_b, sy_h, sdt_b, sdt_h, sB_b, sB_g, sC_b, sC_g,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HAS_Z: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, ROUND_OUT: tl.constexpr, FOLD: tl.constexpr,
    ROUTE: tl.constexpr, TPP: tl.constexpr = 1, CURSOR_FIRST: tl.constexpr = False,
    RING_BY_CURSOR: tl.constexpr = False,
    ROW_CURSOR: tl.constexpr = False, DOTS: tl.constexpr = False, RW: tl.constexpr = 1,
):
    """ROUTE 0: every row (both routes, one kernel); 1: output-only rows only (a flushing row is left
    alone: no output, no append; CURSOR_FIRST: its program reads the cursor before anything and exits, else it
    issues its tile loads first and discards them; ROW_CURSOR: that cursor comes from rwp_ptr[row], the caller's
    write_pos[slot_ids] gathered once per step, so its load runs beside the slot id's instead of after it);
    2: flushing rows only, TPP (head, P-tile)s per program, grid
    (cdiv(H * P-tiles, TPP), batch): the cursor is read first and a program of a non-flushing row exits
    (few, short programs on a plain step; one per tile cost ~40 µs at batch 256 when the flush kernel's
    registers allow 3 programs per SM). DOTS (route 1): B_j . C_t over the ring and B_t . C_t come from the
    prologue's record at bc_ptr (``verify._mamba2_verify_gram_kernel`` at T = 1, which also appended B), so
    the [L, N] B ring is not read."""
    HPG: tl.constexpr = H // G
    if ROUTE == 2:
        NUM_T: tl.constexpr = (P + BP - 1) // BP
        row = tl.program_id(1).to(tl.int64)
        slot, valid = _slot_of(sid_ptr, row)
        if valid & (tl.load(wp_ptr + slot, mask=valid, other=0) >= L - 1):
            for i in range(TPP):
                tile = tl.program_id(0) * TPP + i
                if tile < H * NUM_T:
                    h = tile // NUM_T
                    _decode_row(ck_ptr, cks_ptr, lo_ptr, los_ptr, rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
                                   x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr,
                                   sx_b, sx_h, sz_b, sz_h, sy_b, sy_h, sdt_b, sdt_h, sB_b, sB_g, sC_b, sC_g,
                                   row, h, tile % NUM_T, h // HPG, slot, valid, H, G, P, N, L, LP, BP, BN, HAS_Z,
                                   CK_FP8, HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, ROUND_OUT, FOLD, ROUTE, 0, False, False,
                                   bc_ptr, False, RW)
    else:
        row, h, pt, g = _tl._head_tile(P, BP, HPG)
        slot, valid = _slot_of(sid_ptr, row)
        if ROUTE == 1 and CURSOR_FIRST:
            if ROW_CURSOR:  # the caller's per-row copy: loaded beside the slot id, not after it
                wp_first = tl.load(rwp_ptr + row)
            else:
                wp_first = tl.load(wp_ptr + slot, mask=valid, other=0)
            if tl.where(valid, wp_first, 0) < L - 1:  # padding rows run (they write zeros)
                _decode_row(ck_ptr, cks_ptr, lo_ptr, los_ptr, rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
                               x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr,
                               sx_b, sx_h, sz_b, sz_h, sy_b, sy_h, sdt_b, sdt_h, sB_b, sB_g, sC_b, sC_g,
                               row, h, pt, g, slot, valid, H, G, P, N, L, LP, BP, BN, HAS_Z, CK_FP8, HAS_LO, LO_FP8,
                               ROUND_CK, ROUND_LO, ROUND_OUT, FOLD, ROUTE, wp_first, True, RING_BY_CURSOR,
                               bc_ptr, DOTS, RW)
        else:
            _decode_row(ck_ptr, cks_ptr, lo_ptr, los_ptr, rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
                           x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr,
                           sx_b, sx_h, sz_b, sz_h, sy_b, sy_h, sdt_b, sdt_h, sB_b, sB_g, sC_b, sC_g,
                           row, h, pt, g, slot, valid, H, G, P, N, L, LP, BP, BN, HAS_Z, CK_FP8, HAS_LO, LO_FP8,
                           ROUND_CK, ROUND_LO, ROUND_OUT, FOLD, ROUTE, 0, False, RING_BY_CURSOR, bc_ptr, DOTS, RW)


@triton.jit
def _decode_row(
    ck_ptr, cks_ptr, lo_ptr, los_ptr, rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr,
    sx_b, sx_h, sz_b, sz_h, sy_b, sy_h, sdt_b, sdt_h, sB_b, sB_g, sC_b, sC_g,
    row, h, pt, g, slot, valid,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    LP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HAS_Z: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, ROUND_OUT: tl.constexpr, FOLD: tl.constexpr,
    ROUTE: tl.constexpr, wp_known, HAS_WP: tl.constexpr, RING_BY_CURSOR: tl.constexpr,
    bc_ptr, DOTS: tl.constexpr, RW: tl.constexpr,
):
    """One (row, head, P-tile). HAS_WP: the caller already loaded the row's cursor (wp_known; any value on a
    padding row). RING_BY_CURSOR: the cursor is read right after the tile load is issued and ring entries at or
    past it are never read (a plain step moves wp entries, not L)."""
    HPG: tl.constexpr = H // G
    KEYS: tl.constexpr = DOTS and ROUTE == 1  # the group's dot products from the prologue's record
    # row masks from scalar limits; the N axis is masked only when N is not a power of two (as in eager)
    offs_p, offs_n, offs_l, pm, nm, rl = _tl._limit_masks(pt, valid, P, BP, N, BN, L, LP)
    tile_mask = _tile_mask(pm, nm, N, BN)
    st_off = offs_p[:, None] * N + offs_n[None, :]
    sh = slot * H + h                             # (slot, head)
    sg = slot * G + g                             # (slot, group)

    # ---- 1) the step's big read: checkpoint tile (or its low-precision copy; a flush-only launch reads
    #         the fp32 checkpoint straight away) ----
    if HAS_LO and ROUTE != 2:
        S0 = tl.load(lo_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if LO_FP8:
            S0 = S0 * tl.load(los_ptr + sh * P + offs_p, mask=pm, other=0.0)[:, None]
    else:  # written out, not _tl._load_state: the helper measured 2.7 % slower on the fused fp32 step (H200)
        S0 = tl.load(ck_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if CK_FP8:
            S0 = S0 * tl.load(cks_ptr + sh * P + offs_p, mask=pm, other=0.0)[:, None]
    # ---- 2) the ring: all L entries with no cursor dependency, or (RING_BY_CURSOR) only the wp written ones ----
    if HAS_WP:
        wp = tl.where(valid, wp_known, 0)
    elif RING_BY_CURSOR:
        wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    if RING_BY_CURSOR:
        rl = rl & (offs_l < wp)
    rB_mask = _tile_mask(rl, nm, N, BN)
    rx_mask = _ring_mask(rl, pm, P, BP)           # the ring x tile [LP, BP]
    rx_base = rx_ptr + sh * L * P
    rdt_base = rdt_ptr + sh * L
    rB_base = rB_ptr + sg * L * N
    xr_raw = tl.load(rx_base + offs_l[:, None] * P + offs_p[None, :], mask=rx_mask, other=0.0)
    dtr_raw = tl.load(rdt_base + offs_l, mask=rl, other=0.0)
    if KEYS:  # record: [B_j . C_t (LP) | B_t . C_t, 0]
        rec = bc_ptr + (row * G + g) * RW
        BCr = tl.load(rec + offs_l)
        BCt = tl.load(rec + LP)
    else:
        rB_raw = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :], mask=rB_mask, other=0.0)
    # ---- 3) cursor (one scalar) and this token's inputs ----
    if not (HAS_WP or RING_BY_CURSOR):
        wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    xt_raw = tl.load(x_ptr + row * sx_b + h * sx_h + offs_p, mask=pm, other=0.0)
    v = tl.load(dt_ptr + row * sdt_b + h * sdt_h).to(tl.float32) + tl.load(bias_ptr + h).to(tl.float32)
    if not KEYS:
        Bt_raw = tl.load(B_ptr + row * sB_b + g * sB_g + offs_n, mask=nm, other=0.0)
    Ct = tl.load(C_ptr + row * sC_b + g * sC_g + offs_n, mask=nm, other=0.0).to(tl.float32)
    A_h = tl.load(A_ptr + h).to(tl.float32)
    D_h = tl.load(D_ptr + h).to(tl.float32)
    if HAS_Z:
        zt = tl.load(z_ptr + row * sz_b + h * sz_h + offs_p, mask=pm, other=0.0).to(tl.float32)

    # ---- compute: mask ring entries j >= wp in arithmetic (where, not *0: stale entries may be NaN) ----
    lm = offs_l < wp                               # wp = 0 on a padding row
    xt = xt_raw.to(tl.float32)
    dtt = tl.where(valid, _softplus(v), 0.0)
    dtr = tl.where(lm, dtr_raw, 0.0)
    xr = tl.where(lm[:, None], xr_raw.to(tl.float32), 0.0)                        # [LP, BP]
    if not KEYS:
        Bt = Bt_raw.to(tl.float32)
        rB = tl.where(lm[:, None], rB_raw.to(tl.float32), 0.0)                    # [LP, BN]
    c_r = A_h * tl.cumsum(dtr, axis=0)
    ct = A_h * (tl.sum(dtr, axis=0) + dtt)
    wr = tl.where(lm, dtr * tl.exp(ct - c_r), 0.0)                                # [LP]
    flush = valid & (wp >= L - 1)
    if ROUTE == 1:
        if not KEYS:
            BCr, BCt = _ring_bc(rB, Bt, Ct)
        yv = _output_only(S0, ct, wr, xr, BCr, BCt, Ct, xt, dtt)
    elif ROUTE == 2:
        yv = _state_route(S0, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ct, wr, xr, rB, rdt_base,
                          rx_base, rB_base, A_h, wp, dtt, xt, Bt, Ct, offs_p, offs_n, pm, nm, P, N, L, CK_FP8,
                          HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, FOLD)
    else:
        if flush:
            # state route from the fp32 checkpoint (dual precision: S0 above was the copy)
            if HAS_LO:
                S = _load_state(ck_ptr + sh * P * N, cks_ptr + sh * P, st_off, tile_mask, offs_p, pm, CK_FP8)
            else:
                S = S0
            yv = _state_route(S, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ct, wr, xr, rB,
                              rdt_base, rx_base, rB_base, A_h, wp, dtt, xt, Bt, Ct, offs_p, offs_n, pm, nm, P, N, L,
                              CK_FP8, HAS_LO, LO_FP8, ROUND_CK, ROUND_LO, FOLD)
        else:
            BCr, BCt = _ring_bc(rB, Bt, Ct)
            yv = _output_only(S0, ct, wr, xr, BCr, BCt, Ct, xt, dtt)
    # ---- append at ring position wp (output-only route of a real row) ----
    app = valid & (wp < L - 1)
    wpa = tl.where(app, wp, 0)
    tl.store(rx_base + wpa * P + offs_p, xt_raw.to(rx_ptr.dtype.element_ty), mask=offs_p < tl.where(app, P, 0))
    tl.store(rdt_base + wpa, dtt, mask=app & (pt == 0))
    if not KEYS:  # (the prologue appended B)
        b_writer = app & (pt == 0) & ((h % HPG) == 0)
        tl.store(rB_base + wpa * N + offs_n, Bt_raw.to(rB_ptr.dtype.element_ty),
                 mask=offs_n < tl.where(b_writer, N, 0))
    # ---- output (a plain-only launch leaves a flushing row to the flush launch) ----
    yv = yv + D_h * xt
    if HAS_Z:
        yv = yv * (zt * tl.sigmoid(zt))
    yv = tl.where(valid, yv, 0.0)
    if ROUND_OUT:
        yv = _round_bf16(yv)
    if ROUTE == 1:
        ym = offs_p < tl.where(flush, 0, P)
    else:
        ym = offs_p < P
    tl.store(y_ptr + row * sy_b + h * sy_h + offs_p, yv.to(y_ptr.dtype.element_ty), mask=ym)


@triton.jit
def _state_route(S, ck_ptr, cks_ptr, lo_ptr, los_ptr, sh, st_off, tile_mask, ct, wr, xr, rB, rdt_base, rx_base,
                 rB_base, A_h, wp, dtt, xt, Bt, Ct, offs_p, offs_n, pm, nm, P: tl.constexpr, N: tl.constexpr,
                 L: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
                 ROUND_CK: tl.constexpr, ROUND_LO: tl.constexpr, FOLD: tl.constexpr):
    """Flush: S_t from the fp32 checkpoint S + ring + this token, written to ckpt (and the copy); returns y."""
    S = _fold_ring(S, ct, wr, xr, rB, rdt_base, rx_base, rB_base, A_h, wp, offs_p, offs_n, pm, nm, P, N, L, FOLD)
    S += (dtt * xt)[:, None] * Bt[None, :]
    _store_tile(ck_ptr + sh * P * N, cks_ptr + sh * P, st_off, S, offs_p, pm, tile_mask, CK_FP8, ROUND_CK)
    if HAS_LO:
        _store_tile(lo_ptr + sh * P * N, los_ptr + sh * P, st_off, S, offs_p, pm, tile_mask, LO_FP8, ROUND_LO)
    return tl.sum(S * Ct[None, :], axis=1)


@triton.jit
def _ring_bc(rB, Bt, Ct):
    """The group's dot products in the program: B_j . C_t over the ring [LP] (rB zero past the cursor), B_t . C_t."""
    return tl.sum(rB * Ct[None, :], axis=1), tl.sum(Bt * Ct, axis=0)


@triton.jit
def _output_only(S0, ct, wr, xr, BCr, BCt, Ct, xt, dtt):
    """y (before D x and the gate) of the output-only route: e^{c_t} S0.C_t + ring terms + this token's."""
    return (tl.exp(ct) * tl.sum(S0 * Ct[None, :], axis=1)
            + tl.sum((wr * BCr)[:, None] * xr, axis=0) + (dtt * BCt) * xt)


def pick_decode_config(ckpt, ckpt_lo, P: int, N: int, rows: int) -> tuple[int, int]:
    """(BLOCK_P, num_warps) for `rows` = batch x heads (the fold: `pick_fold`).

    A read-only step needs about twice the bytes in flight of the eager read+write step to reach the same rate, so
    the lever is tile elements per thread: [64, N] tiles on 2 warps once batch x heads fills the GPU (>= 1024 rows),
    else a [16, N] (fp32) or [32, N] (low-precision copy) tile on 2 warps for more programs.

    fold = how a flush rebuilds S_t: "serial" rank-1 updates (register-light; the rarely taken branch sets the
    register budget of every step), one fp32 dot over the ring ("dot" FMA, "tf32x3" tensor cores), or "bf16x3"
    (bf16 tensor cores, the checkpoint as the accumulator). Measurements: docs/tuning/replay.md."""
    lo = ckpt_lo is not None
    cap = triton.next_power_of_2(P)
    bp = min(64 if rows >= 1024 else (32 if lo else 16), cap)
    return bp, 2


def pick_fold(ckpt_lo, BP: int, ring_B=None) -> str:
    """The flush fold for [64, N] tiles with a low-precision copy: bf16x3 with a bf16 B ring (it accumulates into
    the decayed checkpoint and is exact in bf16), else tf32x3; serial for smaller tiles (unmeasured with bf16x3)
    and for the fused fp32 step, where bf16x3 was no faster once the rings were cold in L2
    (docs/tuning/replay.md)."""
    if BP != 64 or ckpt_lo is None:
        return "serial"
    if ring_B is not None and ring_B.dtype == torch.bfloat16:
        return "bf16x3"
    return "tf32x3" if ckpt_lo is not None and ckpt_lo.dtype == torch.bfloat16 else "serial"


def launch_decode(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z, y, *,
                     L, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, config=None, split=None,
                     flush_config=None, cursor_first: bool = False, row_wp=None, ring_by_cursor: bool | None = None,
                     ring_dots: bool | None = None, overlap: bool | None = None):
    """x [b,H,P], dt [b,H], B/C [b,G,N], z [b,H,P] or None, y [b,H,P] (written). Inner strides 1.
    split: None = `split_default`; True = output-only launch (config) + flush launch (`resolve_flush_config`,
    twice config's warps by default),
    False = one fused launch (config). cursor_first (split): the output-only launch reads the cursor before its
    tile, so a flushing row's program reads nothing more (kernel CURSOR_FIRST). row_wp (int32 [b], optional):
    write_pos[slot_ids] gathered by the caller once per step (every layer shares it; padding rows any value);
    a split step's output-only launch then reads each row's cursor beside its slot id, so a flushing row reads
    nothing and the others wait no longer than before (kernel CURSOR_FIRST + ROW_CURSOR); a fused step
    ignores it (the flush step's output-only launch then costs a fraction of a plain step's; docs/tuning/replay.md).
    ring_by_cursor: the fused / output-only launch reads only
    the ring entries below the cursor (kernel RING_BY_CURSOR); None = `replay_common.ring_by_cursor_default`.
    ring_dots (split): the output-only launch takes B_j . C_t and B_t . C_t from the group prologue
    (``verify._mamba2_verify_gram_kernel`` at T = 1) instead of reading the B ring (kernel DOTS);
    None = `replay_common.ring_dots_default`. overlap (split, CUDA): the flush launch on a high-priority side stream
    beside the output-only launch; None = `replay_common.overlap_default`."""
    slots, H, P, N = ckpt.shape
    G = ring_B.shape[1]
    b = slot_ids.shape[0]
    if b == 0:
        return y
    bp, nw, fold, maxnreg = rc.decode_config(config, pick_decode_config(ckpt, ckpt_lo, P, N, b * H),
                                             lambda block, _: pick_fold(ckpt_lo, block, ring_B))
    if split is None:
        split = split_default(ckpt_lo, b * H)
    if ring_by_cursor is None:
        ring_by_cursor = rc.ring_by_cursor_default(split)
    if ring_dots is None:
        ring_dots = rc.ring_dots_default(split)
    # default flush launch: twice the warps (the flush holds S and the ring fold; dual [64, N] on 2 warps spills)
    # 8 tiles per program: with the per-row cursor a little faster than 16 (docs/tuning/replay.md)
    fbp, fnw, ffold, tpp = rc.resolve_flush_config(flush_config, bp, 2 * nw, fold, 8)
    if "bf16x3" in (fold, ffold if split else None) and ring_B.dtype != torch.bfloat16:
        raise ValueError(f"config: fold 'bf16x3' needs a bf16 B ring (exact in bf16), got {ring_B.dtype}")
    if row_wp is not None and not (row_wp.dtype == torch.int32 and tuple(row_wp.shape) == (b,)):
        raise ValueError(f"row_wp: expected int32 [{b}] (write_pos[slot_ids]), got {row_wp.dtype} "
                         f"{tuple(row_wp.shape)}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    dummy = ckpt
    zz = z if z is not None else x
    LP, BN = max(16, triton.next_power_of_2(L)), triton.next_power_of_2(N)
    TP = 2  # the prologue's window width at T = 1 (verify: max(2, T))
    RW = LP + TP  # its record: [B_j . C_t (LP) | B_t . C_t, 0]
    bc = dummy
    if split and ring_dots:
        bc = torch.empty(b, G, RW, dtype=torch.float32, device=x.device)
        _mamba2_verify_gram_kernel[(G, b)](
            ring_B, write_pos, B, C, slot_ids, bc, B.stride(0), 0, B.stride(1), C.stride(0), 0, C.stride(1),
            G=G, N=N, L=L, T=1, TP=TP, LP=LP, BN=BN, ROOM=L - 1,
            ROUND_RB=interp and ring_B.dtype == torch.bfloat16 and B.dtype != torch.bfloat16,
            num_warps=4 if BN >= 128 else 2)
    args = (ckpt, ckpt_scale if ckpt_scale is not None else dummy,
            ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
            ring_x, ring_dt, ring_B, write_pos,
            x, dt, A, B, C, D, dt_bias, zz, y, slot_ids, row_wp if row_wp is not None else slot_ids, bc,
            x.stride(0), x.stride(1), zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
            dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1))
    meta = dict(H=H, G=G, P=P, N=N, L=L, LP=LP, BN=BN, RW=RW,
                HAS_Z=z is not None, CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
                ROUND_CK=interp and ckpt.dtype in (torch.bfloat16, torch.float8_e4m3fn),
                ROUND_LO=interp and ckpt_lo is not None and ckpt_lo.dtype in (torch.bfloat16, torch.float8_e4m3fn),
                ROUND_OUT=interp and y.dtype == torch.bfloat16)
    regs = {} if maxnreg is None else {"maxnreg": int(maxnreg)}
    grid = (H * triton.cdiv(P, bp), b)
    if not split:
        _mamba2_replay_decode_kernel[grid](*args, **meta, BP=bp, FOLD=FOLDS[fold], ROUTE=0, num_warps=nw,
                                              RING_BY_CURSOR=bool(ring_by_cursor), **regs)
        return y

    def output_only():
        _mamba2_replay_decode_kernel[grid](*args, **meta, BP=bp, FOLD=FOLDS[fold], ROUTE=1, num_warps=nw,
                                              CURSOR_FIRST=cursor_first or row_wp is not None,
                                              ROW_CURSOR=row_wp is not None, RING_BY_CURSOR=bool(ring_by_cursor),
                                              DOTS=bool(ring_dots), **regs)

    def flush():
        _mamba2_replay_decode_kernel[(triton.cdiv(H * triton.cdiv(P, fbp), tpp), b)](
            *args, **meta, BP=fbp, FOLD=FOLDS[ffold], ROUTE=2, TPP=tpp, num_warps=fnw)

    # the two launches touch disjoint rows (by cursor), so their order is free and they may run side by side
    rc.run_split(x.device, output_only, flush, rc.overlap_default(split) if overlap is None else overlap)
    return y
