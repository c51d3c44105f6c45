"""Triton kernels of the Mamba-2 ReplaySSM backend (decode, verify, flush in one kernel body).

One program = (batch row, chunk of HPP heads of one group, block of BP rows of P). It loads the
group's ring B and window B/C once and forms every B_j . C_t it needs once (per-group precompute
shared by the HPP heads of the chunk), then per head:
  * output-only route: one pass over the S0 tile [BP, N] (or its low-precision copy) for S0 . C_t,
    plus the weighted ring sum over x_j — never writes the state;
  * state route (flush): S_t is rebuilt from the fp32 checkpoint by replaying the ring serially in
    the eager order (S <- e^{A dt_j} S + dt_j x_j B_j^T, next entry prefetched: register-light,
    so the rarely taken branch does not lower the occupancy of every step), plus the current
    token; it writes the checkpoint (+ low-precision copy) and y = S_t . C_t.
The cursor is read with an atomic ticket in write_pos's high bits: every program of a slot adds
WP_TICKET and keeps the old low bits; the last arrival writes the new cursor. So one launch both
reads and moves the cursor with no race and no extra buffer.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._tl import _decode_cursor, _group_tile, _load_state, _serial_fold, _store_state, _window_cursor
from ..replay_common import FOLDS, WP_TICKET, is_fp8, next_pow2
from .decode import _fold_ring

MODE_DECODE, MODE_VERIFY, MODE_FLUSH = 0, 1, 2


@triton.jit
def _mamba2_head_group_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr, sid_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sy_b, sy_t, sy_h,
    sdt_b, sdt_t, sdt_h, sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr, min_room,
    T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HPP: tl.constexpr, MODE: tl.constexpr, HAS_Z: tl.constexpr, CK_FP8: tl.constexpr,
    HAS_LO: tl.constexpr, LO_FP8: tl.constexpr, ADVANCE: tl.constexpr, NPROG: tl.constexpr,
    TICKET: tl.constexpr, FOLD: tl.constexpr = 0,
):
    """Decode (MODE 0: one token, its own ordering below), verify (MODE 1: a T-token window, output-only)
    and flush (MODE 2: fold ring[:wp]); one signature, a constexpr branch per mode."""
    row = tl.program_id(0)
    hc = tl.program_id(1)
    pb = tl.program_id(2)
    slot = tl.load(sid_ptr + row).to(tl.int32)
    valid = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    if MODE == 0:
        # Decode step (T = 1), ordered for latency: the big checkpoint-tile read is issued first, the
        # cursor atomic and ring reads overlap with it; the flush branch rebuilds S_t with one fp32 dot
        # (its register spills stay in that rarely taken branch).
        hpg: tl.constexpr = H // G
        h0, g, offs_p, pm, offs_n, nm, offs_l = _group_tile(hc, pb, valid, HPP, hpg, P, BP, N, BN, LP)
        tile_mask = pm[:, None] & nm[None, :]
        st_off = offs_p[:, None] * N + offs_n[None, :]
        rB_base = rB_ptr + (slot64 * G + g) * L * N
        for hh in tl.static_range(HPP):
            h = h0 + hh
            ring_h = slot64 * H + h
            # 1) the checkpoint tile (or its low-precision copy): the step's big read, issued first
            if HAS_LO:
                S0 = _load_state(lo_ptr + ring_h * P * N, los_ptr + ring_h * P, st_off, tile_mask, offs_p, pm, LO_FP8)
            else:
                S0 = _load_state(ck_ptr + ring_h * P * N, cks_ptr + ring_h * P, st_off, tile_mask, offs_p, pm, CK_FP8)
            # 2) this token's inputs (independent of the cursor)
            xt_raw = tl.load(x_ptr + row * sx_b + h * sx_h + offs_p, mask=pm, other=0.0)
            xt = xt_raw.to(tl.float32)
            v = tl.load(dt_ptr + row * sdt_b + h * sdt_h, mask=valid, other=0.0).to(tl.float32)
            v = v + tl.load(bias_ptr + h).to(tl.float32)
            A_h = tl.load(A_ptr + h).to(tl.float32)
            D_h = tl.load(D_ptr + h).to(tl.float32)
            if HAS_Z:
                zt = tl.load(z_ptr + row * sz_b + h * sz_h + offs_p, mask=pm, other=0.0).to(tl.float32)
            if hh == 0:
                Bt_raw = tl.load(B_ptr + row * sB_b + g * sB_g + offs_n, mask=nm, other=0.0)
                Bt = Bt_raw.to(tl.float32)
                Ct = tl.load(C_ptr + row * sC_b + g * sC_g + offs_n, mask=nm, other=0.0).to(tl.float32)
                # 3) cursor: relaxed atomic ticket (_decode_cursor)
                wp, flush, n_w = _decode_cursor(wp_ptr, slot64, valid, L, ADVANCE, NPROG, TICKET)
                lm = offs_l < wp
                # 4) the group's ring B and every B_j . C_t, once for the HPP heads of this program
                rB = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :],
                             mask=lm[:, None] & nm[None, :], other=0.0).to(tl.float32)      # [LP, BN]
                BCr = tl.sum(rB * Ct[None, :], axis=1)
                BCt = tl.sum(Bt * Ct, axis=0)
                b_writer = ((h0 % hpg) == 0) & (pb == 0)
                tl.store(rB_base + wp * N + offs_n, Bt_raw.to(rB_ptr.dtype.element_ty),
                         mask=offs_n < tl.where(b_writer, n_w * N, 0))
            dtr = tl.load(rdt_ptr + ring_h * L + offs_l, mask=lm, other=0.0)                   # [LP] fp32
            xr = tl.load(rx_ptr + ring_h * L * P + offs_l[:, None] * P + offs_p[None, :],
                         mask=lm[:, None] & pm[None, :], other=0.0).to(tl.float32)          # [LP, BP]
            e = tl.exp(v)
            u1 = 1.0 + e
            # softplus like torch (identity above 20); log1p(e) = log(u) * e / (u - 1)
            dtt = tl.where(v > 20.0, v, tl.where(u1 == 1.0, e, tl.log(u1) * (e / (u1 - 1.0))))
            dtt = tl.where(valid, dtt, 0.0)
            c_r = A_h * tl.cumsum(dtr, axis=0)
            ct = A_h * (tl.sum(dtr, axis=0) + dtt)
            wr = dtr * tl.exp(ct - c_r)
            tl.store(rx_ptr + ring_h * L * P + wp * P + offs_p, xt_raw.to(rx_ptr.dtype.element_ty),
                     mask=offs_p < tl.where(n_w > 0, P, 0))
            tl.store(rdt_ptr + ring_h * L + wp, dtt, mask=(n_w > 0) & (pb == 0))
            if flush:
                # state route: S_t = e^{c_t} S0 + (x * w)^T B over the ring + dt_t x_t B_t^T from the
                # fp32 checkpoint -> checkpoint (+ low-precision copy)
                if HAS_LO or CK_FP8:
                    S = _load_state(ck_ptr + ring_h * P * N, cks_ptr + ring_h * P, st_off, tile_mask, offs_p, pm,
                                    CK_FP8)
                else:
                    S = S0
                S = _serial_fold(S, rx_ptr + ring_h * L * P + offs_p, rB_base + offs_n, rdt_ptr + ring_h * L, P, N, wp,
                                 A_h, pm, nm, L, True)
                S = tl.exp(A_h * dtt) * S + (dtt * xt)[:, None] * Bt[None, :]
                _store_state(ck_ptr + ring_h * P * N, cks_ptr + ring_h * P, st_off, S, offs_p, pm, tile_mask,
                             CK_FP8)
                if HAS_LO:
                    _store_state(lo_ptr + ring_h * P * N, los_ptr + ring_h * P, st_off, S, offs_p, pm,
                                 tile_mask, LO_FP8)
                yv = tl.sum(S * Ct[None, :], axis=1)
            else:
                # output-only route: S0 . C_t + the weighted ring sum; the state is only read
                yv = (tl.exp(ct) * tl.sum(S0 * Ct[None, :], axis=1)
                      + tl.sum((wr * BCr)[:, None] * xr, axis=0) + (dtt * BCt) * xt)
            yv = yv + D_h * xt
            if HAS_Z:
                yv = yv * zt * tl.sigmoid(zt)
            tl.store(y_ptr + row * sy_b + h * sy_h + offs_p, yv.to(y_ptr.dtype.element_ty), mask=offs_p < P)
    else:

        wp, flush = _window_cursor(wp_ptr, slot64, valid, L, min_room, MODE, ADVANCE, NPROG, TICKET)

        hpg = H // G
        h0, g, offs_p, pm, offs_n, nm, offs_l = _group_tile(hc, pb, valid, HPP, hpg, P, BP, N, BN, LP)
        lm = offs_l < wp  # wp = 0 on a skipped row
        tile_mask = pm[:, None] & nm[None, :]
        b_writer = ((h0 % hpg) == 0) & (pb == 0)  # one program per group writes the ring's B

        # ---- group level, once per program: ring B, window B / C, every B_j . C_t ----
        rB_base = rB_ptr + (slot64 * G + g) * L * N  # scalar bases + int32 in-tile offsets (registers)
        if MODE == 1:
            rB = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :],
                         mask=lm[:, None] & nm[None, :], other=0.0).to(tl.float32)          # [LP, BN]
            # verify: window tiles [TP, .]; window token r sits at ring position wp + r
            offs_t = tl.arange(0, TP)
            tm = offs_t < tl.where(valid, T, 0)
            Bw = tl.load(B_ptr + row * sB_b + offs_t[:, None] * sB_t + g * sB_g + offs_n[None, :],
                         mask=tm[:, None] & nm[None, :], other=0.0)                         # [TP, BN]
            Cw = tl.load(C_ptr + row * sC_b + offs_t[:, None] * sC_t + g * sC_g + offs_n[None, :],
                         mask=tm[:, None] & nm[None, :], other=0.0).to(tl.float32)
            Bwf = Bw.to(tl.float32)
            wpos = wp + offs_t
            wmask = (offs_t < tl.where(valid, T, 0)) & (wpos < L)
            tl.store(rB_base + wpos[:, None] * N + offs_n[None, :],
                     Bw.to(rB_ptr.dtype.element_ty),
                     mask=((offs_t < tl.where(b_writer, T, 0)) & (wpos < L))[:, None] & nm[None, :])
            BCr = tl.zeros((LP, TP), dtype=tl.float32)   # column t: B_j . C_t over the ring
            BCw = tl.zeros((TP, TP), dtype=tl.float32)   # column t: B_r . C_t over the window
            for t in tl.static_range(T):
                Ct = tl.sum(tl.where(offs_t[:, None] == t, Cw, 0.0), axis=0)
                BCr = tl.where(offs_t[None, :] == t, tl.sum(rB * Ct[None, :], axis=1)[:, None], BCr)
                BCw = tl.where(offs_t[None, :] == t, tl.sum(Bwf * Ct[None, :], axis=1)[:, None], BCw)

        for hh in range(HPP):
            h = h0 + hh
            A_h = tl.load(A_ptr + h).to(tl.float32)
            ring_h = slot64 * H + h
            rx_base = rx_ptr + ring_h * L * P
            rdt_base = rdt_ptr + ring_h * L
            st_off = offs_p[:, None] * N + offs_n[None, :]
            ck_base = ck_ptr + ring_h * P * N
            lo_base = lo_ptr + ring_h * P * N
            cks_base = cks_ptr + ring_h * P
            los_base = los_ptr + ring_h * P
            if MODE == 2:
                if flush:
                    S = tl.load(ck_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S = S * tl.load(cks_base + offs_p, mask=pm, other=0.0)[:, None]
                    if FOLD == 0:  # the eager recurrence, replayed serially (one load latency per entry)
                        S = _serial_fold(S, rx_base + offs_p, rB_base + offs_n,
                                         rdt_base, P, N, wp, A_h, pm, nm, L, True)
                    else:  # the whole ring loaded at once and folded as one dot (the decode kernel's fold)
                        dtr = tl.load(rdt_base + offs_l, mask=lm, other=0.0)
                        ct = A_h * tl.sum(dtr, axis=0)
                        wr = tl.where(lm, dtr * tl.exp(ct - A_h * tl.cumsum(dtr, axis=0)), 0.0)
                        xr = tl.load(rx_base + offs_l[:, None] * P + offs_p[None, :],
                                     mask=lm[:, None] & pm[None, :], other=0.0).to(tl.float32)
                        rBf = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :],
                                      mask=lm[:, None] & nm[None, :], other=0.0).to(tl.float32)
                        S = _fold_ring(S, ct, wr, xr, rBf, rdt_base, rx_base, rB_base, A_h, wp, offs_p, offs_n,
                                       pm, nm, P, N, L, FOLD)
                    _store_state(ck_base, cks_base, st_off, S, offs_p, pm, tile_mask, CK_FP8)
                    if HAS_LO:
                        _store_state(lo_base, los_base, st_off, S, offs_p, pm, tile_mask, LO_FP8)
            else:
                D_h = tl.load(D_ptr + h).to(tl.float32)
                bias_h = tl.load(bias_ptr + h).to(tl.float32)
                dtr = tl.load(rdt_base + offs_l, mask=lm, other=0.0)             # [LP] fp32
                c_r = A_h * tl.cumsum(dtr, axis=0)
                tot = tl.sum(dtr, axis=0)
                xr = tl.load(rx_base + offs_l[:, None] * P + offs_p[None, :],
                             mask=lm[:, None] & pm[None, :], other=0.0).to(tl.float32)      # [LP, BP]
            if MODE == 1:
                v = tl.load(dt_ptr + row * sdt_b + offs_t * sdt_t + h * sdt_h, mask=tm, other=0.0)
                v = v.to(tl.float32) + bias_h
                e = tl.exp(v)
                u1 = 1.0 + e
                dtw = tl.where(v > 20.0, v, tl.where(u1 == 1.0, e, tl.log(u1) * (e / (u1 - 1.0))))
                dtw = tl.where(tm, dtw, 0.0)                                                # [TP]
                c_w = A_h * (tot + tl.cumsum(dtw, axis=0))
                xw_raw = tl.load(x_ptr + row * sx_b + offs_t[:, None] * sx_t + h * sx_h + offs_p[None, :],
                                 mask=tm[:, None] & pm[None, :], other=0.0)                  # [TP, BP]
                xw = xw_raw.to(tl.float32)
                tl.store(rx_base + wpos[:, None] * P + offs_p[None, :],
                         xw_raw.to(rx_ptr.dtype.element_ty), mask=wmask[:, None] & pm[None, :])
                tl.store(rdt_base + wpos, dtw,
                         mask=(offs_t < tl.where(pb == 0, T, 0)) & wmask)
                if HAS_LO:
                    S0 = tl.load(lo_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if LO_FP8:
                        S0 = S0 * tl.load(los_base + offs_p, mask=pm, other=0.0)[:, None]
                else:
                    S0 = tl.load(ck_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S0 = S0 * tl.load(cks_base + offs_p, mask=pm, other=0.0)[:, None]
                for t in tl.static_range(T):
                    sel = offs_t == t
                    Ct = tl.sum(tl.where(sel[:, None], Cw, 0.0), axis=0)
                    ct = tl.sum(tl.where(sel, c_w, 0.0), axis=0)
                    wr = dtr * tl.exp(ct - c_r) * tl.sum(tl.where(sel[None, :], BCr, 0.0), axis=1)
                    ww = tl.where(offs_t <= t, dtw * tl.exp(ct - c_w), 0.0) * tl.sum(
                        tl.where(sel[None, :], BCw, 0.0), axis=1)
                    xt = tl.sum(tl.where(sel[:, None], xw, 0.0), axis=0)
                    yv = (tl.exp(ct) * tl.sum(S0 * Ct[None, :], axis=1)
                          + tl.sum(wr[:, None] * xr, axis=0) + tl.sum(ww[:, None] * xw, axis=0) + D_h * xt)
                    if HAS_Z:
                        zt = tl.load(z_ptr + row * sz_b + t * sz_t + h * sz_h + offs_p, mask=pm,
                                     other=0.0).to(tl.float32)
                        yv = yv * zt * tl.sigmoid(zt)
                    tl.store(y_ptr + row * sy_b + t * sy_t + h * sy_h + offs_p,
                             yv.to(y_ptr.dtype.element_ty), mask=offs_p < P)



def pick_config(batch: int, H: int, P: int, hpg: int, T: int = 1, lo: bool = False
                ) -> tuple[int, int, int, int | None]:
    """(BLOCK_P, heads per program, num_warps, maxnreg): a [32, 128] tile on 8 warps (16 KiB in
    fp32, like the eager kernel), P split down to 8 rows at small batch to keep ~1024 programs in
    flight; no register cap (capped configs were slower). Heads per program > 1 (B.C shared by more
    heads of a group) is available through ``config``. See docs/tuning/replay.md."""
    if T > 1 and batch * H >= 1024:  # verify windows: [64, N] tiles on 4 warps (docs/tuning/replay.md)
        return min(64, next_pow2(P)), 1, 4, None
    bp = min(32, next_pow2(P))
    while bp > 8 and batch * H * triton.cdiv(P, bp) < 1024:
        bp //= 2
    nw = 8 if bp >= 32 else 4
    return bp, 1, nw, None


# rows (batch x heads) from which a flush without a config folds its ring as one tf32x3 dot instead of serially:
# 1.43-1.50x on nemotron_h_8b's layer at batch 32-256 (H100, docs/tuning/replay.md); smaller launches unmeasured
FLUSH_DOT_MIN_ROWS = 4096


def flush_config(batch: int, H: int, P: int, hpg: int) -> tuple:
    """A flush launch's default config: the whole ring folded as one tf32x3 dot from FLUSH_DOT_MIN_ROWS rows
    ([32, N] tiles on 8 warps, [64, N] on 4 from twice that), else pick_config's serial fold."""
    bp = next_pow2(P)
    if batch * H < FLUSH_DOT_MIN_ROWS or bp < 16:
        return pick_config(batch, H, P, hpg)
    bp = min(64 if batch * H >= 2 * FLUSH_DOT_MIN_ROWS else 32, bp)
    return bp, 1, 4 if bp >= 64 else 8, None, "tf32x3"


def launch(mode, ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z, y, *,
           L, T, ckpt_scale, ckpt_lo, ckpt_lo_scale, advance, min_room=None, config=None):
    slots, H, P, N = ckpt.shape
    G = ring_B.shape[1]
    hpg = H // G
    b = slot_ids.shape[0]
    if b == 0:
        return
    if not config and mode == MODE_FLUSH:
        config = flush_config(b, H, P, hpg)
    bp, hpp, nw, maxnreg = ((tuple(config) + (None,))[:4] if config
                            else pick_config(b, H, P, hpg, T, ckpt_lo is not None and mode == MODE_DECODE))
    # a flush may fold its ring as one dot (config's fifth entry: "dot" fp32 FMA, "tf32x3"; tl.dot tiles need
    # BLOCK_P >= 16), else serially (docs/tuning/replay.md)
    fold = (tuple(config) + (None, None))[4] if config else None
    fold = "serial" if fold is None else fold
    if fold not in ("serial", "dot", "tf32x3"):
        raise ValueError(f"config: flush fold {fold!r}, expected one of ['dot', 'serial', 'tf32x3']")
    if fold != "serial" and (mode != MODE_FLUSH or bp < 16):
        raise ValueError(f"config: fold {fold!r} needs a flush launch with BLOCK_P >= 16, got BLOCK_P={bp}")
    if hpg % hpp:
        hpp = 1
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    grid = (b, H // hpp, triton.cdiv(P, bp))
    nprog = grid[1] * grid[2]
    assert nprog < (1 << 15)
    dummy = ckpt
    if mode == MODE_FLUSH:
        x = dt = B = C = D = dt_bias = y = dummy
        sx = sz = sy = (0, 0, 0)
        sdt = sB = sC = (0, 0, 0)
    else:
        sx = (x.stride(0), x.stride(1), x.stride(2))
        sy = (y.stride(0), y.stride(1), y.stride(2))
        sz = (z.stride(0), z.stride(1), z.stride(2)) if z is not None else (0, 0, 0)
        sdt = (dt.stride(0), dt.stride(1), dt.stride(2))
        sB = (B.stride(0), B.stride(1), B.stride(2))
        sC = (C.stride(0), C.stride(1), C.stride(2))
    kern = _mamba2_head_group_kernel
    kern[grid](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_x, ring_dt, ring_B, write_pos,
        x, dt, A, B, C, D, dt_bias, z if z is not None else dummy, y, slot_ids,
        *sx, *sz, *sy, *sdt, *sB, *sC,
        H, G, P, N, L, L + 1 if min_room is None else int(min_room),
        T=T, TP=max(2, next_pow2(T)), LP=max(16, next_pow2(L)), BP=bp, BN=max(16, next_pow2(N)),
        HPP=hpp, MODE=mode, HAS_Z=z is not None, CK_FP8=is_fp8(ckpt),
        HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo), ADVANCE=bool(advance) and mode != MODE_VERIFY,
        NPROG=nprog,
        TICKET=WP_TICKET, FOLD=FOLDS[fold], num_warps=nw, **extra,
    )
