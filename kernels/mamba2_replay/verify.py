"""Mamba-2 ReplaySSM speculative verify, per-head: shaped like the eager-style decode kernel of ``decode``.

Main kernel: one program per (P-tile x head, batch row), grid ``(H * cdiv(P, BLOCK_P), batch)``, one
head per program, state tile [BLOCK_P, N] read once (the fp32 checkpoint, or the low-precision copy
ckpt_lo / an fp8 checkpoint with its per-row scales).

Latency layout (as in the decode per-head kernel): nothing but the slot id sits in front of the loads. The
state tile, all L ring entries (x tile, dt; masked by ``offs_l < L``, not by the cursor), the
window's x tile [T, BLOCK_P] and dt, and the cursor (one scalar) are all issued up front; the cursor
is used only in arithmetic: ring entries j >= wp are zeroed with ``where`` (stale ring contents may
be NaN, never multiplied by 0). Then per window token s (``tl.static_range(T)``), with
c_j = A * cumsum(dt)_j over ring + window (the running window sums are scalars):
    y_s = e^{c_s} (S0 . C_s) + sum_{j<wp} dt_j e^{c_s-c_j} (B_j . C_s) x_j
          + sum_{r<=s} dt_r e^{c_s-c_r} (B_r . C_s) x_r + D x_s            (* silu(z_s) if z)
x_s, dt_s, C_s, z_s are loaded directly per s (tiny, L1/L2-hot); the ring and the earlier window
tokens enter as weighted sums over the [L, BLOCK_P] ring x and [T, BLOCK_P] window x tiles (no row
selection). The state tile is held as [N / NC, BLOCK_P, NC] (n = a * NC + c): a warp load covers
NC-wide column chunks of several rows (whole 32-byte sectors) and each thread holds all N / NC
chunks of its rows, so the T dots S0 . C_s are mostly in-thread sums (few shuffles).

The group-level dot products B_j . C_s (ring) and B_r . C_s (window) are the same for the H/G heads
of a group and all their P-tiles. ``gram=True`` computes them once per (row, group) in a small
prologue kernel (grid (G, batch); it also writes the window's B to the ring) into a scratch
[batch, G, T, LP + TP] fp32, and the main kernel loads row s directly; ``gram=False`` forms them in
every program (one launch; for small batches). Token s is written to the ring at wp + s: x by every
program (its P-tile), dt by P-tile 0, B by the prologue or by P-tile 0 of the group's first head.
write_pos and the checkpoint are never written.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from .._tl import _head_tile, _ring_mask, _round_bf16, _slot_of, _softplus, _tile_mask
from ..replay_common import is_fp8, next_pow2, parse_verify_config

NCHUNK = 16  # N-chunk width NC of the state-tile split (64 bytes of fp32 per row per warp load)


@triton.jit
def _mamba2_verify_gram_kernel(
    rB_ptr, wp_ptr, B_ptr, C_ptr, sid_ptr, bc_ptr,
    sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    G: tl.constexpr, N: tl.constexpr, L: tl.constexpr, T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr,
    BN: tl.constexpr, ROUND_RB: tl.constexpr, ROOM: tl.constexpr = 0,
):
    """Per (group, row): bc[row, g, s] = [B_j . C_s for ring j < L (0 for j >= wp) | B_r . C_s for
    window r < TP (0 past T)], and the window's B at ring[wp : wp+T] where wp + T <= ROOM (0: L; a decode step
    passes L - 1: a flushing row appends nothing)."""
    g = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    slot, valid = _slot_of(sid_ptr, row)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TP)
    offs_n = tl.arange(0, BN)
    nm = offs_n < N
    rl = offs_l < tl.where(valid, L, 0)
    tm = offs_t < tl.where(valid, T, 0)
    rB_base = rB_ptr + (slot * G + g) * L * N
    rB_raw = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :], mask=rl[:, None] & nm[None, :], other=0.0)
    Bw = tl.load(B_ptr + row * sB_b + g * sB_g + offs_t[:, None] * sB_t + offs_n[None, :],
                 mask=tm[:, None] & nm[None, :], other=0.0).to(tl.float32)                # [TP, BN]
    wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    lm = offs_l < wp
    rB = tl.where(lm[:, None], rB_raw.to(tl.float32), 0.0)                              # [LP, BN]
    app = valid & (wp + T <= (L if ROOM == 0 else ROOM))
    wpa = tl.where(app, wp, 0)
    rec = bc_ptr + (row * G + g) * T * (LP + TP)
    for s in tl.static_range(T):
        Cs = tl.load(C_ptr + row * sC_b + s * sC_t + g * sC_g + offs_n, mask=nm, other=0.0).to(tl.float32)
        tl.store(rec + s * (LP + TP) + offs_l, tl.where(lm, tl.sum(rB * Cs[None, :], axis=1), 0.0))
        tl.store(rec + s * (LP + TP) + LP + offs_t, tl.sum(Bw * Cs[None, :], axis=1))
        Bs_raw = tl.load(B_ptr + row * sB_b + s * sB_t + g * sB_g + offs_n, mask=nm, other=0.0)
        if ROUND_RB:
            Bs_raw = _round_bf16(Bs_raw.to(tl.float32))
        tl.store(rB_base + (wpa + s) * N + offs_n, Bs_raw.to(rB_ptr.dtype.element_ty),
                 mask=offs_n < tl.where(app, N, 0))


@triton.jit
def _mamba2_replay_verify_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr, sid_ptr, bc_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sy_b, sy_t, sy_h,
    sdt_b, sdt_t, sdt_h, sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, NC: tl.constexpr,
    GRAM: tl.constexpr, HAS_Z: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_RX: tl.constexpr, ROUND_RB: tl.constexpr, ROUND_OUT: tl.constexpr, DOT: tl.constexpr, TD: tl.constexpr,
):
    HPG: tl.constexpr = H // G
    NA: tl.constexpr = BN // NC
    row, h, pt, g = _head_tile(P, BP, HPG)
    slot, valid = _slot_of(sid_ptr, row)

    # masks come from scalar limits (0 on a padding row: it reads and writes no cache); the N axis
    # is masked only when N is not a power of two, so the tile loads stay vectorised
    offs_p = pt * BP + tl.arange(0, BP)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TP)
    offs_n = tl.arange(0, BN)
    n2 = tl.arange(0, NA)[:, None] * NC + tl.arange(0, NC)[None, :]             # [NA, NC]: n = a * NC + c
    n3 = n2[:, None, :]                                                        # [NA, 1, NC]
    pm = offs_p < tl.where(valid, P, 0)
    nm = offs_n < N
    rl = offs_l < tl.where(valid, L, 0)          # every ring entry: independent of the cursor
    tm = offs_t < tl.where(valid, T, 0)
    if BN == N:
        tile_mask = pm[None, :, None]
    else:
        tile_mask = pm[None, :, None] & (n3 < N)
    rx_mask = _ring_mask(rl, pm, P, BP)
    wx_mask = _ring_mask(tm, pm, P, BP)           # the window's x tile [TP, BP]
    if DOT:  # plain [BP, BN] tile: the T state products S0 . C_s are one tl.dot
        st_off = offs_p[:, None] * N + offs_n[None, :]
        tile_mask = _tile_mask(pm, nm, N, BN)
        sc_b = offs_p[:, None]
    else:
        st_off = offs_p[None, :, None] * N + n3                               # [NA, BP, NC]
        sc_b = offs_p[None, :, None]
    sh = slot * H + h                             # (slot, head)
    sg = slot * G + g                             # (slot, group)

    # ---- 1) the big read: state tile (or its low-precision copy), once ----
    if HAS_LO:
        S0 = tl.load(lo_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if LO_FP8:
            S0 = S0 * tl.load(los_ptr + sh * P + sc_b, mask=pm[:, None] if DOT else pm[None, :, None], other=0.0)
    else:
        S0 = tl.load(ck_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if CK_FP8:
            S0 = S0 * tl.load(cks_ptr + sh * P + sc_b, mask=pm[:, None] if DOT else pm[None, :, None], other=0.0)
    if DOT:  # [BP, TD] = S0 [BP, BN] x C_window^T [BN, TD] (tokens >= T zero), 3-pass tf32 (~fp32 accuracy)
        offs_td = tl.arange(0, TD)
        Cw = tl.load(C_ptr + row * sC_b + g * sC_g + offs_td[None, :] * sC_t + offs_n[:, None],
                     mask=(offs_td[None, :] < T) & nm[:, None], other=0.0).to(tl.float32)
        SC = tl.dot(S0, Cw, input_precision="tf32x3")
    # ---- 2) the whole ring, no cursor dependency ----
    rx_base = rx_ptr + sh * L * P
    rdt_base = rdt_ptr + sh * L
    rB_base = rB_ptr + sg * L * N
    xr_raw = tl.load(rx_base + offs_l[:, None] * P + offs_p[None, :], mask=rx_mask, other=0.0)   # [LP, BP]
    dtr_raw = tl.load(rdt_base + offs_l, mask=rl, other=0.0)
    if not GRAM:
        rB_raw = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :], mask=rl[:, None] & nm[None, :],
                         other=0.0)                                                            # [LP, BN]
        Bw = tl.load(B_ptr + row * sB_b + g * sB_g + offs_t[:, None] * sB_t + offs_n[None, :],
                     mask=tm[:, None] & nm[None, :], other=0.0).to(tl.float32)                # [TP, BN]
    # ---- 3) cursor (one scalar), per-head parameters, the window's x tile and raw dt ----
    wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    A_h = tl.load(A_ptr + h).to(tl.float32)
    D_h = tl.load(D_ptr + h).to(tl.float32)
    bias_h = tl.load(bias_ptr + h).to(tl.float32)
    xw = tl.load(x_ptr + row * sx_b + h * sx_h + offs_t[:, None] * sx_t + offs_p[None, :],
                 mask=wx_mask, other=0.0).to(tl.float32)                                  # [TP, BP]
    vw = tl.load(dt_ptr + row * sdt_b + h * sdt_h + offs_t * sdt_t, mask=tm, other=0.0).to(tl.float32)

    # ---- ring part, cursor in arithmetic only (where, not *0: stale entries may be NaN) ----
    lm = offs_l < wp                               # wp = 0 on a padding row
    dtr = tl.where(lm, dtr_raw, 0.0)
    xr = tl.where(lm[:, None], xr_raw.to(tl.float32), 0.0)                          # [LP, BP]
    if not GRAM:
        rB = tl.where(lm[:, None], rB_raw.to(tl.float32), 0.0)                      # [LP, BN]
    cum_r = tl.cumsum(dtr, axis=0)                                                  # [LP]
    tot = tl.sum(dtr, axis=0)
    dtw = tl.where(tm, _softplus(vw + bias_h), 0.0)                                 # [TP]
    cum_w = tl.cumsum(dtw, axis=0)                                                  # [TP]
    run = tot * 0.0                                # window dt summed so far (scalar)
    app = valid & (wp + T <= L)                    # the caller guarantees it; never write past L
    wpa = tl.where(app, wp, 0)
    bc_rec = bc_ptr + (row * G + g) * T * (LP + TP)
    for s in tl.static_range(T):
        # token s: inputs loaded directly (L1/L2-hot)
        xs_raw = tl.load(x_ptr + row * sx_b + s * sx_t + h * sx_h + offs_p, mask=pm, other=0.0)
        xs = xs_raw.to(tl.float32)
        C_base = C_ptr + row * sC_b + s * sC_t + g * sC_g
        if DOT:
            SCs = tl.sum(tl.where(offs_td[None, :] == s, SC, 0.0), axis=1)                # [BP]
        else:
            C3 = tl.load(C_base + n2, mask=n2 < N, other=0.0).to(tl.float32)[:, None, :]   # [NA, 1, NC]
            SCs = tl.sum(tl.sum(S0 * C3, axis=0), axis=1)
        vs = tl.load(dt_ptr + row * sdt_b + s * sdt_t + h * sdt_h).to(tl.float32)
        dts = tl.where(valid, _softplus(vs + bias_h), 0.0)
        run += dts
        cs = A_h * (tot + run)                     # c_s
        # B_j . C_s over the ring [LP] and B_r . C_s over the window [TP]
        if GRAM:
            BCr = tl.load(bc_rec + s * (LP + TP) + offs_l)
            BCw = tl.load(bc_rec + s * (LP + TP) + LP + offs_t)
        else:
            Cs = tl.load(C_base + offs_n, mask=nm, other=0.0).to(tl.float32)          # [BN]
            BCr = tl.sum(rB * Cs[None, :], axis=1)
            BCw = tl.sum(Bw * Cs[None, :], axis=1)
        # weights dt e^{c_s - c} (B . C_s): ring j < wp, window r <= s (where: r > s exponents grow)
        wr = tl.where(lm, dtr * tl.exp(cs - A_h * cum_r) * BCr, 0.0)
        ww = tl.where(offs_t <= s, dtw * tl.exp(A_h * (run - cum_w)) * BCw, 0.0)
        yv = (tl.exp(cs) * SCs
              + tl.sum(wr[:, None] * xr, axis=0) + tl.sum(ww[:, None] * xw, axis=0) + D_h * xs)
        if HAS_Z:
            zs = tl.load(z_ptr + row * sz_b + s * sz_t + h * sz_h + offs_p, mask=pm, other=0.0).to(tl.float32)
            yv = yv * (zs * tl.sigmoid(zs))
        yv = tl.where(valid, yv, 0.0)
        if ROUND_OUT:
            yv = _round_bf16(yv)
        tl.store(y_ptr + row * sy_b + s * sy_t + h * sy_h + offs_p, yv.to(y_ptr.dtype.element_ty),
                 mask=offs_p < P)
        # ---- ring entry wp + s: x (this P-tile), dt (P-tile 0), B (P-tile 0 of the group's first head) ----
        if ROUND_RX:
            xs_raw = _round_bf16(xs)
        tl.store(rx_base + (wpa + s) * P + offs_p, xs_raw.to(rx_ptr.dtype.element_ty),
                 mask=offs_p < tl.where(app, P, 0))
        tl.store(rdt_base + wpa + s, dts, mask=app & (pt == 0))
        if not GRAM:  # (with GRAM the prologue wrote B)
            Bs_raw = tl.load(B_ptr + row * sB_b + s * sB_t + g * sB_g + offs_n, mask=nm, other=0.0)
            if ROUND_RB:
                Bs_raw = _round_bf16(Bs_raw.to(tl.float32))
            b_writer = app & (pt == 0) & ((h % HPG) == 0)
            tl.store(rB_base + (wpa + s) * N + offs_n, Bs_raw.to(rB_ptr.dtype.element_ty),
                     mask=offs_n < tl.where(b_writer, N, 0))


def pick_config(ckpt, ckpt_lo, P: int, rows: int, T: int) -> tuple[int, int, bool, bool]:
    """(BLOCK_P, num_warps, gram, dot) for `rows` = batch x heads. Verify is compute-bound (T state products per
    window), so from 1024 rows: the per-group prologue (gram) and the window's T state products as one tf32x3
    tl.dot on [64, N] tiles, 2 warps (tl.dot needs BLOCK_P and N >= 16); below, one launch with [16, N] (fp32) /
    [32, N] (low-precision copy) on 2 warps. See docs/tuning/replay.md."""
    cap = next_pow2(P)
    if rows >= 1024:
        bp = min(64, cap)
        return bp, 2, True, bp >= 16 and next_pow2(ckpt.shape[-1]) >= 16
    return min(32 if ckpt_lo is not None else 16, cap), 2, False, False


def launch_verify(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z, y, *,
                     L, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, config=None):
    """x [b,T,H,P], dt [b,T,H], B/C [b,T,G,N], z [b,T,H,P] or None, y [b,T,H,P] (written; every
    element, padding rows zero). Inner strides 1. config = (BLOCK_P, num_warps[, gram[, maxnreg]])."""
    import torch

    slots, H, P, N = ckpt.shape
    G = ring_B.shape[1]
    b, T = x.shape[0], x.shape[1]
    if b == 0 or T == 0:
        return y
    default = pick_config(ckpt, ckpt_lo, P, b * H, T)
    bp, nw, gram, maxnreg, dot = (parse_verify_config(config, default, "BLOCK_P") if config
                                  else (default[0], default[1], default[2], None, default[3]))
    if dot and (bp < 16 or next_pow2(N) < 16):
        raise ValueError(f"config: dot=True needs BLOCK_P >= 16 and N >= 16 (tl.dot tiles), got BLOCK_P={bp}, N={N}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    TP, LP, BN = max(2, next_pow2(T)), max(16, next_pow2(L)), next_pow2(N)
    round_rb = interp and ring_B.dtype == torch.bfloat16 and B.dtype != torch.bfloat16
    sB = (B.stride(0), B.stride(1), B.stride(2))
    sC = (C.stride(0), C.stride(1), C.stride(2))
    if gram:
        bc = torch.empty(b, G, T, LP + TP, dtype=torch.float32, device=x.device)
        _mamba2_verify_gram_kernel[(G, b)](
            ring_B, write_pos, B, C, slot_ids, bc, *sB, *sC,
            G=G, N=N, L=L, T=T, TP=TP, LP=LP, BN=BN, ROUND_RB=round_rb, num_warps=4 if BN >= 128 else 2)
    else:
        bc = y  # unused
    dummy = ckpt
    zz = z if z is not None else x
    extra = {} if maxnreg is None else {"maxnreg": int(maxnreg)}
    grid = (H * triton.cdiv(P, bp), b)
    _mamba2_replay_verify_kernel[grid](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_x, ring_dt, ring_B, write_pos,
        x, dt, A, B, C, D, dt_bias, zz, y, slot_ids, bc,
        x.stride(0), x.stride(1), x.stride(2), zz.stride(0), zz.stride(1), zz.stride(2),
        y.stride(0), y.stride(1), y.stride(2), dt.stride(0), dt.stride(1), dt.stride(2), *sB, *sC,
        H=H, G=G, P=P, N=N, L=L, T=T, TP=TP, LP=LP, BP=bp, BN=BN, NC=min(NCHUNK, BN), GRAM=bool(gram),
        HAS_Z=z is not None, CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
        ROUND_RX=interp and ring_x.dtype == torch.bfloat16 and x.dtype != torch.bfloat16,
        ROUND_RB=round_rb, ROUND_OUT=interp and y.dtype == torch.bfloat16, DOT=bool(dot), TD=max(16, TP),
        num_warps=nw, **extra,
    )
    return y
