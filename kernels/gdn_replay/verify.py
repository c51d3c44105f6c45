"""Gated DeltaNet ReplaySSM speculative verify, per-head: shaped like the eager-style decode kernels.

Main kernel: one program per (V-tile x value head, batch row), grid ``(HV * cdiv(V, BLOCK_V), batch)``,
one value head per program, state tile [BLOCK_V, K] read once (the fp32 checkpoint, or the
low-precision copy ckpt_lo / an fp8 checkpoint with its per-row scales).

Latency layout: nothing but the slot id sits in front of the loads. The state tile, all L ring
entries (u tile, g; masked by ``offs_l < L``, not by the cursor), the window's g and the cursor
(one scalar) are issued up front; the cursor is used only in arithmetic (ring entries j >= wp are
zeroed with ``where``: stale ring contents may be NaN). Then per window token s
(``tl.static_range(T)``), with Gam = running sum of g over ring + window (window sums kept as
scalars), forward substitution:
    S_{s-1}^+ k_s = e^{G_s} S0 k_s + sum_{j<wp} e^{G_s-Gam_j} (k_j . k_s) u_j + sum_{r<s} e^{G_s-G_r} (k_r . k_s) u_r
    u_s = beta_s (v_s - S_{s-1}^+ k_s)
    o_s = [the same with q_s] + u_s (k_s . q_s)
(k L2-normalised, q normalised and scaled). v_s, g_s, beta_s, k_s, q_s are loaded directly per s;
the corrected values u_r of earlier window tokens stay in a [T, BLOCK_V] fp32 register tile (row s
written once by a ``where`` insert, read through one causal-weighted sum; no row selection). The
state tile is held as [K / KC, BLOCK_V, KC] (k = a * KC + c) so S0 k_s and S0 q_s are mostly
in-thread sums (see the Mamba-2 verify).

The key-head quantities (normalised k_s, q_s; k_j . k_s, k_j . q_s over the ring; k_r . k_s,
k_r . q_s over the window; k_s . q_s) are the same for the HV/Hk value heads of a key head and all
their V-tiles. ``gram=True`` computes them once per (row, key head) in a small prologue kernel (grid
(Hk, batch); it also writes the window's normalised k to the ring) into a scratch
[batch, Hk, T, RW] fp32, and the main kernel loads row s directly; ``gram=False`` forms them in
every program (one launch; for small batches). Token s is written to the ring at wp + s: u by every
program (its V-tile), g by V-tile 0, k by the prologue or by V-tile 0 of the key head's first value
head. write_pos and the checkpoint are never written.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from .._tl import _head_tile, _ring_mask, _round_bf16, _slot_of
from ..replay_common import is_fp8, next_pow2, parse_verify_config

KCHUNK = 16  # K-chunk width KC of the state-tile split (64 bytes of fp32 per row per warp load)


@triton.jit
def _gdn_verify_keys_kernel(
    rk_ptr, wp_ptr, q_ptr, k_ptr, sid_ptr, kq_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, scale,
    Hk: tl.constexpr, K: tl.constexpr, L: tl.constexpr, T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr,
    BK: tl.constexpr, RW: tl.constexpr, USE_L2: tl.constexpr, ROUND_RK: tl.constexpr, ROOM: tl.constexpr = 0,
):
    """Per (key head, row, token s) a record of RW fp32: [k_s (BK) | q_s (BK) | k_j . k_s (LP, 0 for
    j >= wp) | k_j . q_s (LP) | k_r . k_s (TP) | k_r . q_s (TP) | k_s . q_s]; and the window's
    normalised k at ring[wp : wp+T] where wp + T <= ROOM (0: L; a decode step passes L - 1: a flushing row
    appends nothing)."""
    hk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    slot, valid = _slot_of(sid_ptr, row)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TP)
    offs_k = tl.arange(0, BK)
    km = offs_k < K
    rl = offs_l < tl.where(valid, L, 0)
    tm = offs_t < tl.where(valid, T, 0)
    rk_base = rk_ptr + (slot * Hk + hk) * L * K
    rk_raw = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :], mask=rl[:, None] & km[None, :], other=0.0)
    kw = tl.load(k_ptr + row * sk_b + hk * sk_h + offs_t[:, None] * sk_t + offs_k[None, :],
                 mask=tm[:, None] & km[None, :], other=0.0).to(tl.float32)                # [TP, BK]
    wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    lm = offs_l < wp
    rk = tl.where(lm[:, None], rk_raw.to(tl.float32), 0.0)                              # [LP, BK]
    if USE_L2:
        kw = kw / tl.sqrt(tl.sum(kw * kw, axis=1) + 1e-6)[:, None]
    app = valid & (wp + T <= (L if ROOM == 0 else ROOM))
    wpa = tl.where(app, wp, 0)
    rec = kq_ptr + (row * Hk + hk) * T * RW
    for s in tl.static_range(T):
        ks = tl.load(k_ptr + row * sk_b + s * sk_t + hk * sk_h + offs_k, mask=km, other=0.0).to(tl.float32)
        qs = tl.load(q_ptr + row * sq_b + s * sq_t + hk * sq_h + offs_k, mask=km, other=0.0).to(tl.float32)
        if USE_L2:
            ks = ks / tl.sqrt(tl.sum(ks * ks, axis=0) + 1e-6)
            qs = qs / tl.sqrt(tl.sum(qs * qs, axis=0) + 1e-6)
        qs = qs * scale
        r = rec + s * RW
        tl.store(r + offs_k, ks)
        tl.store(r + BK + offs_k, qs)
        tl.store(r + 2 * BK + offs_l, tl.where(lm, tl.sum(rk * ks[None, :], axis=1), 0.0))
        tl.store(r + 2 * BK + LP + offs_l, tl.where(lm, tl.sum(rk * qs[None, :], axis=1), 0.0))
        tl.store(r + 2 * BK + 2 * LP + offs_t, tl.sum(kw * ks[None, :], axis=1))
        tl.store(r + 2 * BK + 2 * LP + TP + offs_t, tl.sum(kw * qs[None, :], axis=1))
        tl.store(r + 2 * BK + 2 * LP + 2 * TP, tl.sum(ks * qs, axis=0))
        if ROUND_RK:
            ks = _round_bf16(ks)
        tl.store(rk_base + (wpa + s) * K + offs_k, ks.to(rk_ptr.dtype.element_ty), mask=offs_k < tl.where(app, K, 0))


@triton.jit
def _gdn_replay_verify_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    ru_ptr, rk_ptr, rg_ptr, wp_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, sid_ptr, kq_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_h,
    sbt_b, sbt_t, sbt_h, so_b, so_t, so_h, scale,
    HV: tl.constexpr, Hk: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr,
    RW: tl.constexpr, GRAM: tl.constexpr, USE_L2: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr,
    LO_FP8: tl.constexpr, ROUND_RU: tl.constexpr, ROUND_RK: tl.constexpr, ROUND_OUT: tl.constexpr,
    DOT: tl.constexpr, TD: tl.constexpr,
):
    REP: tl.constexpr = HV // Hk
    KA: tl.constexpr = BK // KC
    row, hv, vt, hk = _head_tile(V, BV, REP)
    slot, valid = _slot_of(sid_ptr, row)

    # masks from scalar limits (0 on a padding row: it reads and writes no cache); K is masked only
    # when it is not a power of two
    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TP)
    k2 = tl.arange(0, KA)[:, None] * KC + tl.arange(0, KC)[None, :]            # [KA, KC]: k = a * KC + c
    k3 = k2[:, None, :]                                                        # [KA, 1, KC]
    vm = offs_v < tl.where(valid, V, 0)
    km = offs_k < K
    rl = offs_l < tl.where(valid, L, 0)          # every ring entry: independent of the cursor
    tm = offs_t < tl.where(valid, T, 0)
    if BK == K:
        tile_mask = vm[None, :, None]
    else:
        tile_mask = vm[None, :, None] & (k3 < K)
    ru_mask = _ring_mask(rl, vm, V, BV)
    if DOT:  # plain [BV, BK] tile: the window's S0 k_s and S0 q_s are one tl.dot (needs GRAM)
        st_off = offs_v[:, None] * K + offs_k[None, :]
        if BK == K:
            tile_mask = vm[:, None]
        else:
            tile_mask = vm[:, None] & km[None, :]
        sc_v = offs_v[:, None]
    else:
        st_off = offs_v[None, :, None] * K + k3                               # [KA, BV, KC]
        sc_v = offs_v[None, :, None]
    sh = slot * HV + hv                           # (slot, value head)
    rk_base = rk_ptr + (slot * Hk + hk) * L * K   # (slot, key head)

    # ---- 1) the big read: state tile (or its low-precision copy), once ----
    if HAS_LO:
        S0 = tl.load(lo_ptr + sh * V * K + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if LO_FP8:
            S0 = S0 * tl.load(los_ptr + sh * V + sc_v, mask=vm[:, None] if DOT else vm[None, :, None], other=0.0)
    else:
        S0 = tl.load(ck_ptr + sh * V * K + st_off, mask=tile_mask, other=0.0).to(tl.float32)
        if CK_FP8:
            S0 = S0 * tl.load(cks_ptr + sh * V + sc_v, mask=vm[:, None] if DOT else vm[None, :, None], other=0.0)
    if DOT:  # one tf32x3 tl.dot: [BV, TD] = S0 [BV, BK] x [BK, TD], columns k_0..k_{T-1}, q_0..q_{T-1}
        # (normalised, from the prologue; q scaled), the rest zero. TD >= 16 pads the MMA's N side
        # anyway, so the q columns ride in the padding (two dots cost twice the MMAs and tf32 splits).
        offs_td = tl.arange(0, TD)
        tcol = tl.where(offs_td < T, offs_td, offs_td - T)
        kq_cols = (kq_ptr + (row * Hk + hk) * T * RW + tcol[None, :] * RW + tl.where(offs_td < T, 0, BK)[None, :]
                   + offs_k[:, None])
        cm = (offs_td[None, :] < 2 * T) & km[:, None]
        SW = tl.dot(S0, tl.load(kq_cols, mask=cm, other=0.0), input_precision="tf32x3")
    # ---- 2) the whole ring, no cursor dependency ----
    ru_base = ru_ptr + sh * L * V
    rg_base = rg_ptr + sh * L
    ru_raw = tl.load(ru_base + offs_l[:, None] * V + offs_v[None, :], mask=ru_mask, other=0.0)   # [LP, BV]
    rg_raw = tl.load(rg_base + offs_l, mask=rl, other=0.0)
    if not GRAM:
        rk_raw = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :], mask=rl[:, None] & km[None, :],
                         other=0.0)                                                            # [LP, BK]
        kw = tl.load(k_ptr + row * sk_b + hk * sk_h + offs_t[:, None] * sk_t + offs_k[None, :],
                     mask=tm[:, None] & km[None, :], other=0.0).to(tl.float32)                # [TP, BK]
    # ---- 3) cursor (one scalar) and the window's log-decays ----
    wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    gw = tl.load(g_ptr + row * sg_b + hv * sg_h + offs_t * sg_t, mask=tm, other=0.0).to(tl.float32)

    # ---- ring part, cursor in arithmetic only (where, not *0: stale entries may be NaN) ----
    lm = offs_l < wp                               # wp = 0 on a padding row
    rg = tl.where(lm, rg_raw, 0.0)
    ru = tl.where(lm[:, None], ru_raw.to(tl.float32), 0.0)                           # [LP, BV]
    Gam = tl.cumsum(rg, axis=0)                                                      # [LP]
    tot = tl.sum(rg, axis=0)
    Gw = tl.cumsum(gw, axis=0)                                                       # [TP] window part
    if not GRAM:
        rk = tl.where(lm[:, None], rk_raw.to(tl.float32), 0.0)                       # [LP, BK]
        if USE_L2:
            kw = kw / tl.sqrt(tl.sum(kw * kw, axis=1) + 1e-6)[:, None]
    run = tot * 0.0                                # window g summed so far (scalar)
    U = tl.zeros((TP, BV), dtype=tl.float32)       # corrected values u_r of the window (fp32)
    app = valid & (wp + T <= L)                    # the caller guarantees it; never write past L
    wpa = tl.where(app, wp, 0)
    kq_rec = kq_ptr + (row * Hk + hk) * T * RW
    for s in tl.static_range(T):
        # token s: inputs loaded directly (L1/L2-hot)
        vs = tl.load(v_ptr + row * sv_b + s * sv_t + hv * sv_h + offs_v, mask=vm, other=0.0).to(tl.float32)
        gs = tl.load(g_ptr + row * sg_b + s * sg_t + hv * sg_h).to(tl.float32)
        bs = tl.load(beta_ptr + row * sbt_b + s * sbt_t + hv * sbt_h).to(tl.float32)
        if GRAM:
            r = kq_rec + s * RW
            ks3 = tl.load(r + k2)                                                      # [KA, KC], normalised
            qs3 = tl.load(r + BK + k2)                                                 # normalised, scaled
            kk_r = tl.load(r + 2 * BK + offs_l)
            kq_r = tl.load(r + 2 * BK + LP + offs_l)
            kk_w = tl.load(r + 2 * BK + 2 * LP + offs_t)
            kq_w = tl.load(r + 2 * BK + 2 * LP + TP + offs_t)
            kqs = tl.load(r + 2 * BK + 2 * LP + 2 * TP)
            rnk = 1.0
            rnq = 1.0
        else:
            k_base = k_ptr + row * sk_b + s * sk_t + hk * sk_h
            q_base = q_ptr + row * sq_b + s * sq_t + hk * sq_h
            ks = tl.load(k_base + offs_k, mask=km, other=0.0).to(tl.float32)
            qs = tl.load(q_base + offs_k, mask=km, other=0.0).to(tl.float32)
            ks3 = tl.load(k_base + k2, mask=k2 < K, other=0.0).to(tl.float32)       # raw rows; S0 k_s and
            qs3 = tl.load(q_base + k2, mask=k2 < K, other=0.0).to(tl.float32)       # S0 q_s scaled after
            if USE_L2:
                rnk = 1.0 / tl.sqrt(tl.sum(ks * ks, axis=0) + 1e-6)
                rnq = 1.0 / tl.sqrt(tl.sum(qs * qs, axis=0) + 1e-6)
            else:
                rnk = 1.0
                rnq = 1.0
            ks = ks * rnk
            qs = qs * (rnq * scale)
            rnq = rnq * scale
            kk_r = tl.sum(rk * ks[None, :], axis=1)
            kq_r = tl.sum(rk * qs[None, :], axis=1)
            kk_w = tl.sum(kw * ks[None, :], axis=1)
            kq_w = tl.sum(kw * qs[None, :], axis=1)
            kqs = tl.sum(ks * qs, axis=0)
        run += gs
        Gs = tot + run
        eGs = tl.exp(Gs)
        # ring: e^{G_s - Gam_j} (k_j . k_s), (k_j . q_s), j < wp
        er = tl.exp(Gs - Gam)                                                        # [LP]
        wk_r = tl.where(lm, er * kk_r, 0.0)
        wq_r = tl.where(lm, er * kq_r, 0.0)
        if DOT:
            S0k = tl.sum(tl.where(offs_td[None, :] == s, SW, 0.0), axis=1)
            S0q = tl.sum(tl.where(offs_td[None, :] == T + s, SW, 0.0), axis=1)
        else:
            S0k = tl.sum(tl.sum(S0 * ks3[:, None, :], axis=0), axis=1)
            S0q = tl.sum(tl.sum(S0 * qs3[:, None, :], axis=0), axis=1)
        Sk = (eGs * rnk) * S0k + tl.sum(wk_r[:, None] * ru, axis=0)
        Sq = (eGs * rnq) * S0q + tl.sum(wq_r[:, None] * ru, axis=0)
        if s > 0:
            # earlier window tokens r < s (causal: where, the r >= s exponents may grow)
            ew = tl.exp(run - Gw)                                                    # [TP]
            Sk += tl.sum(tl.where(offs_t < s, ew * kk_w, 0.0)[:, None] * U, axis=0)
            Sq += tl.sum(tl.where(offs_t < s, ew * kq_w, 0.0)[:, None] * U, axis=0)
        us = bs * (vs - Sk)
        os_ = Sq + us * kqs
        if s + 1 < T:
            U = tl.where(offs_t[:, None] == s, us[None, :], U)
        os_ = tl.where(valid, os_, 0.0)
        if ROUND_OUT:
            os_ = _round_bf16(os_)
        tl.store(o_ptr + row * so_b + s * so_t + hv * so_h + offs_v, os_.to(o_ptr.dtype.element_ty),
                 mask=offs_v < V)
        # ---- ring entry wp + s: u (this V-tile), g (V-tile 0), k (V-tile 0 of the key head's first head) ----
        if ROUND_RU:
            us = _round_bf16(us)
        tl.store(ru_base + (wpa + s) * V + offs_v, us.to(ru_ptr.dtype.element_ty),
                 mask=offs_v < tl.where(app, V, 0))
        tl.store(rg_base + wpa + s, gs, mask=app & (vt == 0))
        if not GRAM:  # (with GRAM the prologue wrote k)
            if ROUND_RK:
                ks = _round_bf16(ks)
            k_writer = app & (vt == 0) & ((hv % REP) == 0)
            tl.store(rk_base + (wpa + s) * K + offs_k, ks.to(rk_ptr.dtype.element_ty),
                     mask=offs_k < tl.where(k_writer, K, 0))


def pick_config(ckpt, ckpt_lo, V: int, K: int, rows: int, T: int) -> tuple[int, int, bool, bool]:
    """(BLOCK_V, num_warps, gram, dot) for `rows` = batch x value heads. Verify is compute-bound (2T reductions
    over the tile per window), not byte-bound: from 1024 rows the per-key-head prologue (gram) and S0 k_s, S0 q_s
    as two tf32x3 tl.dot on [32, K] tiles, 1 warp (tl.dot needs BLOCK_V and K >= 16); below, (16, 2) in one
    launch. See docs/tuning/replay.md."""
    cap = next_pow2(V)
    if rows >= 1024 and cap >= 16 and next_pow2(K) >= 16:
        return min(32, cap), 1, True, True
    return min(16, cap), 2, False, False


def launch_verify(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, *, L, scale=None,
                     use_qk_l2norm=True, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, config=None):
    """q/k [b,T,Hk,K], v [b,T,HV,V], g/beta [b,T,HV], o [b,T,HV,V] (written; every element, padding
    rows zero). Inner strides 1. config = (BLOCK_V, num_warps[, gram[, maxnreg]])."""
    import torch

    slots, HV, V, K = ckpt.shape
    Hk = ring_k.shape[1]
    b, T = v.shape[0], v.shape[1]
    if b == 0 or T == 0:
        return o
    default = pick_config(ckpt, ckpt_lo, V, K, b * HV, T)
    bv, nw, gram, maxnreg, dot = parse_verify_config(config, default[:3], "BLOCK_V") if config else (*default[:3], None,
                                                                                              default[3])
    if dot and not (gram and bv >= 16 and next_pow2(K) >= 16):
        raise ValueError(f"config: dot=True needs gram=True (the prologue's normalised k / q), BLOCK_V >= 16 and "
                         f"K >= 16 (tl.dot tiles), got gram={gram}, BLOCK_V={bv}, K={K}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    TP, LP, BK = max(2, next_pow2(T)), max(16, next_pow2(L)), next_pow2(K)
    RW = 2 * BK + 2 * LP + 4 * TP
    sc = float(K ** -0.5 if scale is None else scale)
    round_rk = interp and ring_k.dtype == torch.bfloat16
    sq = (q.stride(0), q.stride(1), q.stride(2))
    sk = (k.stride(0), k.stride(1), k.stride(2))
    if gram:
        kq = torch.empty(b, Hk, T, RW, dtype=torch.float32, device=v.device)
        _gdn_verify_keys_kernel[(Hk, b)](
            ring_k, write_pos, q, k, slot_ids, kq, *sq, *sk, sc,
            Hk=Hk, K=K, L=L, T=T, TP=TP, LP=LP, BK=BK, RW=RW, USE_L2=bool(use_qk_l2norm), ROUND_RK=round_rk,
            num_warps=4 if BK >= 128 else 2)
    else:
        kq = o  # unused
    dummy = ckpt
    extra = {} if maxnreg is None else {"maxnreg": int(maxnreg)}
    strides = tuple(t.stride(i) for t in (v, g, beta, o) for i in range(3))
    grid = (HV * triton.cdiv(V, bv), b)
    _gdn_replay_verify_kernel[grid](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, o, slot_ids, kq,
        *sq, *sk, *strides, sc,
        HV=HV, Hk=Hk, V=V, K=K, L=L, T=T, TP=TP, LP=LP, BV=bv, BK=BK, KC=min(KCHUNK, BK), RW=RW,
        GRAM=bool(gram), USE_L2=bool(use_qk_l2norm),
        CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
        ROUND_RU=interp and ring_u.dtype == torch.bfloat16, ROUND_RK=round_rk,
        ROUND_OUT=interp and o.dtype == torch.bfloat16, DOT=bool(dot), TD=max(16, next_pow2(2 * T)),
        num_warps=nw, **extra,
    )
    return o
