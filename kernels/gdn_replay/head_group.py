"""Triton kernels of the Gated DeltaNet ReplaySSM backend (decode both routes, verify, flush).

One program = (batch row, HPP value heads sharing one key head, block of BV rows of V). The key
head's ring k, the window's normalised q/k and every dot product k_j.k_t, k_j.q_t are formed once
per program and shared by its HPP value heads. Per value head, with Gam = running sum of g:
  * adjoint (output-only) route: S0 k_t and S0 q_t in one pass over the S0 tile (or its
    low-precision copy), plus ring sums e^{G_t - Gam_j} (k_j.k_t) u_j and (k_j.q_t) u_j; window
    tokens are solved by forward substitution (u_s depends on u_r, r < s). Never forms S.
  * state route: S' = e^{G_t} S0 + (u * e^{G_t - Gam})^T k over the ring (fp32 `ieee` dot), then
    S' k_t, S' q_t. Costs L x the FLOPs of the adjoint route.
  * flush (both routes): replay the ring serially on the fp32 checkpoint tile (S <- e^{g_j} S +
    u_j k_j^T, the eager order; register-light), finish the step (u_t, S_t = e^{g_t} S + u_t k_t^T),
    write ckpt (+ ckpt_lo).
The cursor moves with the same atomic ticket as the Mamba-2 kernel (see mamba2_replay).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._tl import _decode_cursor, _group_tile, _load_state, _serial_fold, _store_state, _window_cursor
from ..replay_common import WP_TICKET, is_fp8, next_pow2

MODE_DECODE, MODE_VERIFY, MODE_FLUSH = 0, 1, 2


@triton.jit
def _gdn_head_group_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    ru_ptr, rk_ptr, rg_ptr, wp_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, sid_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_h,
    sbt_b, sbt_t, sbt_h, so_b, so_t, so_h,
    HV: tl.constexpr, Hk: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr, min_room, scale,
    T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    HPP: tl.constexpr, MODE: tl.constexpr, ROUTE_STATE: tl.constexpr, USE_L2: tl.constexpr,
    CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr, ADVANCE: tl.constexpr,
    NPROG: tl.constexpr, TICKET: tl.constexpr,
):
    """Decode (MODE 0: one token, its own ordering below), verify (MODE 1: a T-token window by forward
    substitution) and flush (MODE 2: fold ring[:wp]); one signature, a constexpr branch per mode."""
    row = tl.program_id(0)
    hc = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(sid_ptr + row).to(tl.int32)
    valid = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    if MODE == 0:
        # Decode step (T = 1), ordered for latency like the Mamba-2 decode kernel: checkpoint tile
        # first, cursor atomic and ring reads overlapping it; flush = serial replay (register-light).
        rep: tl.constexpr = HV // Hk
        hv0, hk, offs_v, vm, offs_k, km, offs_l = _group_tile(hc, vb, valid, HPP, rep, V, BV, K, BK, LP)
        tile_mask = vm[:, None] & km[None, :]
        st_off = offs_v[:, None] * K + offs_k[None, :]
        rk_base = rk_ptr + (slot64 * Hk + hk) * L * K
        for hh in tl.static_range(HPP):
            hv = hv0 + hh
            ring_h = slot64 * HV + hv
            # 1) checkpoint tile (or its low-precision copy) first
            if HAS_LO:
                S0 = _load_state(lo_ptr + ring_h * V * K, los_ptr + ring_h * V, st_off, tile_mask, offs_v, vm, LO_FP8)
            else:
                S0 = _load_state(ck_ptr + ring_h * V * K, cks_ptr + ring_h * V, st_off, tile_mask, offs_v, vm, CK_FP8)
            # 2) this token's inputs
            gt = tl.load(g_ptr + row * sg_b + hv * sg_h, mask=valid, other=0.0).to(tl.float32)
            bt = tl.load(beta_ptr + row * sbt_b + hv * sbt_h, mask=valid, other=0.0).to(tl.float32)
            vt = tl.load(v_ptr + row * sv_b + hv * sv_h + offs_v, mask=vm, other=0.0).to(tl.float32)
            if hh == 0:
                kt = tl.load(k_ptr + row * sk_b + hk * sk_h + offs_k, mask=km, other=0.0).to(tl.float32)
                qt = tl.load(q_ptr + row * sq_b + hk * sq_h + offs_k, mask=km, other=0.0).to(tl.float32)
                # 3) cursor: relaxed atomic ticket (_decode_cursor)
                wp, flush, n_w = _decode_cursor(wp_ptr, slot64, valid, L, ADVANCE, NPROG, TICKET)
                lm = offs_l < wp
                # 4) the key head's ring k and every k_j.k_t, k_j.q_t, once for the HPP value heads
                rk = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :],
                             mask=lm[:, None] & km[None, :], other=0.0).to(tl.float32)      # [LP, BK]
                if USE_L2:
                    kt = kt / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
                    qt = qt / tl.sqrt(tl.sum(qt * qt, axis=0) + 1e-6)
                qt = qt * scale
                k_writer = ((hv0 % rep) == 0) & (vb == 0)
                tl.store(rk_base + wp * K + offs_k, kt.to(rk_ptr.dtype.element_ty),
                         mask=offs_k < tl.where(k_writer, n_w * K, 0))
                kq = tl.sum(kt * qt, axis=0)
                KKr = tl.sum(rk * kt[None, :], axis=1)                                          # [LP]
                KQr = tl.sum(rk * qt[None, :], axis=1)
            rg = tl.load(rg_ptr + ring_h * L + offs_l, mask=lm, other=0.0)                    # [LP] fp32
            ru = tl.load(ru_ptr + ring_h * L * V + offs_l[:, None] * V + offs_v[None, :],
                         mask=lm[:, None] & vm[None, :], other=0.0).to(tl.float32)          # [LP, BV]
            Gam = tl.cumsum(rg, axis=0)
            Gt = tl.sum(rg, axis=0) + gt
            er = tl.where(lm, tl.exp(Gt - Gam), 0.0)
            if flush:
                # flush (both routes): serial replay on the fp32 checkpoint tile, finish the step, write
                if HAS_LO or CK_FP8:
                    S = _load_state(ck_ptr + ring_h * V * K, cks_ptr + ring_h * V, st_off, tile_mask, offs_v, vm,
                                    CK_FP8)
                else:
                    S = S0
                S = _serial_fold(S, ru_ptr + ring_h * L * V + offs_v, rk_base + offs_k, rg_ptr + ring_h * L, V, K, wp,
                                 1.0, vm, km, L, False)
                S = tl.exp(gt) * S
                ut = bt * (vt - tl.sum(S * kt[None, :], axis=1))
                S = S + ut[:, None] * kt[None, :]
                _store_state(ck_ptr + ring_h * V * K, cks_ptr + ring_h * V, st_off, S, offs_v, vm, tile_mask, CK_FP8)
                if HAS_LO:
                    _store_state(lo_ptr + ring_h * V * K, los_ptr + ring_h * V, st_off, S, offs_v, vm, tile_mask,
                                 LO_FP8)
                ot = tl.sum(S * qt[None, :], axis=1)
            else:
                eG = tl.exp(Gt)
                if ROUTE_STATE:
                    # state route: S' = e^{G_t} S0 + (u * e^{G_t - Gam})^T k over the ring (fp32 dot)
                    S = eG * S0 + tl.dot(tl.trans(ru * er[:, None]), rk, input_precision="ieee")
                    ut = bt * (vt - tl.sum(S * kt[None, :], axis=1))
                    ot = tl.sum(S * qt[None, :], axis=1) + ut * kq
                else:
                    # adjoint / output-only route: S0 k_t and S0 q_t in one pass + ring dot products
                    Sk = eG * tl.sum(S0 * kt[None, :], axis=1) + tl.sum((er * KKr)[:, None] * ru, axis=0)
                    Sq = eG * tl.sum(S0 * qt[None, :], axis=1) + tl.sum((er * KQr)[:, None] * ru, axis=0)
                    ut = bt * (vt - Sk)
                    ot = Sq + ut * kq
            tl.store(o_ptr + row * so_b + hv * so_h + offs_v, ot.to(o_ptr.dtype.element_ty), mask=offs_v < V)
            tl.store(ru_ptr + ring_h * L * V + wp * V + offs_v, ut.to(ru_ptr.dtype.element_ty),
                     mask=offs_v < tl.where(n_w > 0, V, 0))
            tl.store(rg_ptr + ring_h * L + wp, gt, mask=(n_w > 0) & (vb == 0))
    else:

        wp, flush = _window_cursor(wp_ptr, slot64, valid, L, min_room, MODE, ADVANCE, NPROG, TICKET)

        rep = HV // Hk
        hv0, hk, offs_v, vm, offs_k, km, offs_l = _group_tile(hc, vb, valid, HPP, rep, V, BV, K, BK, LP)
        lm = offs_l < wp
        tile_mask = vm[:, None] & km[None, :]
        k_writer = ((hv0 % rep) == 0) & (vb == 0)  # one program per key head writes the ring's k

        # ---- key-head level, once per program: ring k, normalised q/k, every k_j.k_t and k_j.q_t ----
        rk_base = rk_ptr + (slot64 * Hk + hk) * L * K  # scalar bases + int32 in-tile offsets (registers)
        if MODE == 1:
            rk = tl.load(rk_base + offs_l[:, None] * K + offs_k[None, :],
                         mask=lm[:, None] & km[None, :], other=0.0).to(tl.float32)          # [LP, BK]
            offs_t = tl.arange(0, TP)
            tm = offs_t < tl.where(valid, T, 0)
            kw = tl.load(k_ptr + row * sk_b + offs_t[:, None] * sk_t + hk * sk_h + offs_k[None, :],
                         mask=tm[:, None] & km[None, :], other=0.0).to(tl.float32)          # [TP, BK]
            qw = tl.load(q_ptr + row * sq_b + offs_t[:, None] * sq_t + hk * sq_h + offs_k[None, :],
                         mask=tm[:, None] & km[None, :], other=0.0).to(tl.float32)
            if USE_L2:
                kw = kw / tl.sqrt(tl.sum(kw * kw, axis=1) + 1e-6)[:, None]
                qw = qw / tl.sqrt(tl.sum(qw * qw, axis=1) + 1e-6)[:, None]
            qw = qw * scale
            wpos = wp + offs_t
            wmask = (offs_t < tl.where(valid, T, 0)) & (wpos < L)
            tl.store(rk_base + wpos[:, None] * K + offs_k[None, :],
                     kw.to(rk_ptr.dtype.element_ty),
                     mask=((offs_t < tl.where(k_writer, T, 0)) & (wpos < L))[:, None] & km[None, :])
            KKr = tl.zeros((LP, TP), dtype=tl.float32)  # column s: k_j . k_s over the ring
            KQr = tl.zeros((LP, TP), dtype=tl.float32)
            KKw = tl.zeros((TP, TP), dtype=tl.float32)  # column s: k_r . k_s over the window
            KQw = tl.zeros((TP, TP), dtype=tl.float32)
            for s in tl.static_range(T):
                ks = tl.sum(tl.where(offs_t[:, None] == s, kw, 0.0), axis=0)
                qs = tl.sum(tl.where(offs_t[:, None] == s, qw, 0.0), axis=0)
                KKr = tl.where(offs_t[None, :] == s, tl.sum(rk * ks[None, :], axis=1)[:, None], KKr)
                KQr = tl.where(offs_t[None, :] == s, tl.sum(rk * qs[None, :], axis=1)[:, None], KQr)
                KKw = tl.where(offs_t[None, :] == s, tl.sum(kw * ks[None, :], axis=1)[:, None], KKw)
                KQw = tl.where(offs_t[None, :] == s, tl.sum(kw * qs[None, :], axis=1)[:, None], KQw)

        for hh in range(HPP):
            hv = hv0 + hh
            ring_h = slot64 * HV + hv
            ru_base = ru_ptr + ring_h * L * V
            rg_base = rg_ptr + ring_h * L
            st_off = offs_v[:, None] * K + offs_k[None, :]
            ck_base = ck_ptr + ring_h * V * K
            lo_base = lo_ptr + ring_h * V * K
            cks_base = cks_ptr + ring_h * V
            los_base = los_ptr + ring_h * V
            if MODE == 2:
                if flush:
                    S = tl.load(ck_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S = S * tl.load(cks_base + offs_v, mask=vm, other=0.0)[:, None]
                    S = _serial_fold(S, ru_base + offs_v, rk_base + offs_k,
                                     rg_base, V, K, wp, 1.0, vm, km, L, False)
                    _store_state(ck_base, cks_base, st_off, S, offs_v, vm, tile_mask, CK_FP8)
                    if HAS_LO:
                        _store_state(lo_base, los_base, st_off, S, offs_v, vm, tile_mask, LO_FP8)
            if MODE == 1:
                rg = tl.load(rg_base + offs_l, mask=lm, other=0.0)                # [LP] fp32
                Gam = tl.cumsum(rg, axis=0)
                tot = tl.sum(rg, axis=0)
                ru = tl.load(ru_base + offs_l[:, None] * V + offs_v[None, :],
                             mask=lm[:, None] & vm[None, :], other=0.0).to(tl.float32)      # [LP, BV]
                gw = tl.load(g_ptr + row * sg_b + offs_t * sg_t + hv * sg_h, mask=tm, other=0.0).to(tl.float32)
                bw = tl.load(beta_ptr + row * sbt_b + offs_t * sbt_t + hv * sbt_h, mask=tm,
                             other=0.0).to(tl.float32)
                Gw = tot + tl.cumsum(gw, axis=0)                                             # [TP]
                vw = tl.load(v_ptr + row * sv_b + offs_t[:, None] * sv_t + hv * sv_h + offs_v[None, :],
                             mask=tm[:, None] & vm[None, :], other=0.0).to(tl.float32)      # [TP, BV]
                if HAS_LO:
                    S0 = tl.load(lo_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if LO_FP8:
                        S0 = S0 * tl.load(los_base + offs_v, mask=vm, other=0.0)[:, None]
                else:
                    S0 = tl.load(ck_base + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S0 = S0 * tl.load(cks_base + offs_v, mask=vm, other=0.0)[:, None]
                # forward substitution over the window: u_s needs u_r, r < s (kept in U's rows)
                U = tl.zeros((TP, BV), dtype=tl.float32)
                for s in tl.static_range(T):
                    sel = offs_t == s
                    Gs = tl.sum(tl.where(sel, Gw, 0.0), axis=0)
                    eGs = tl.exp(Gs)
                    er = tl.where(lm, tl.exp(Gs - Gam), 0.0)
                    ew = tl.where(offs_t < s, tl.exp(Gs - Gw), 0.0)
                    ks = tl.sum(tl.where(sel[:, None], kw, 0.0), axis=0)
                    qs = tl.sum(tl.where(sel[:, None], qw, 0.0), axis=0)
                    KQs = tl.sum(tl.where(sel[None, :], KQw, 0.0), axis=1)
                    Sk = (eGs * tl.sum(S0 * ks[None, :], axis=1)
                          + tl.sum((er * tl.sum(tl.where(sel[None, :], KKr, 0.0), axis=1))[:, None] * ru, axis=0)
                          + tl.sum((ew * tl.sum(tl.where(sel[None, :], KKw, 0.0), axis=1))[:, None] * U, axis=0))
                    Sq = (eGs * tl.sum(S0 * qs[None, :], axis=1)
                          + tl.sum((er * tl.sum(tl.where(sel[None, :], KQr, 0.0), axis=1))[:, None] * ru, axis=0)
                          + tl.sum((ew * KQs)[:, None] * U, axis=0))
                    u_s = (tl.sum(tl.where(sel, bw, 0.0), axis=0)
                           * (tl.sum(tl.where(sel[:, None], vw, 0.0), axis=0) - Sk))
                    o_s = Sq + u_s * tl.sum(tl.where(sel, KQs, 0.0), axis=0)
                    U = tl.where(sel[:, None], u_s[None, :], U)
                    tl.store(o_ptr + row * so_b + s * so_t + hv * so_h + offs_v,
                             o_s.to(o_ptr.dtype.element_ty), mask=offs_v < V)
                tl.store(ru_base + wpos[:, None] * V + offs_v[None, :],
                         U.to(ru_ptr.dtype.element_ty), mask=wmask[:, None] & vm[None, :])
                tl.store(rg_base + wpos, gw, mask=(offs_t < tl.where(vb == 0, T, 0)) & wmask)



def pick_config(batch: int, HV: int, V: int, rep: int, T: int = 1, route_state: bool = False,
                lo: bool = False) -> tuple[int, int, int, int | None]:
    """(BLOCK_V, value heads per program, num_warps, maxnreg) of the first GDN replay kernel: fewer warps per
    tile, i.e. more loads in flight per thread, as for Mamba-2. Two value heads per program share the key head's
    ring k and k.k / k.q products. Smaller batches split V (down to 8 rows; 16 for the state route's dot).
    See docs/tuning/replay.md."""
    floor = 16 if route_state else 8
    if T == 1 and not route_state and batch * HV >= 4096:  # batch >= 128 (measured at 256 only):
        # one warp per program beat 2 warps, fp32 and with a bf16 copy (docs/tuning/replay.md)
        bv1 = max(floor, min(32 if lo or rep % 2 else 16, next_pow2(V)))
        return (bv1, 1, 1, None) if lo or rep % 2 else (bv1, 2, 1, None)
    if not route_state:  # decode and verify windows ((16, 2, 2) beat (32, 1, 8) on verify)
        return max(floor, min(16, next_pow2(V))), (2 if batch * HV >= 256 and rep % 2 == 0 else 1), 2, None
    bv = max(floor, min(32, next_pow2(V)))
    while bv > floor and batch * HV * triton.cdiv(V, bv) < 1024:
        bv //= 2
    nw = 8 if bv >= 32 else 4
    return bv, 1, nw, None


def launch(mode, ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, *, L, T, scale,
           use_qk_l2norm, route_state, ckpt_scale, ckpt_lo, ckpt_lo_scale, advance, min_room=None,
           config=None):
    slots, HV, V, K = ckpt.shape
    Hk = ring_k.shape[1]
    rep = HV // Hk
    b = slot_ids.shape[0]
    if b == 0:
        return
    bv, hpp, nw, maxnreg = ((tuple(config) + (None,))[:4] if config
                            else pick_config(b, HV, V, rep, T, route_state and mode == MODE_DECODE,
                                             ckpt_lo is not None and mode == MODE_DECODE))
    if rep % hpp:
        hpp = 1
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    grid = (b, HV // hpp, triton.cdiv(V, bv))
    nprog = grid[1] * grid[2]
    assert nprog < (1 << 15)
    dummy = ckpt
    if mode == MODE_FLUSH:
        q = k = v = g = beta = o = dummy
        strides = (0,) * 18
    else:
        strides = tuple(t.stride(i) for t in (q, k, v, g, beta, o) for i in range(3))
    kern = _gdn_head_group_kernel
    kern[grid](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, o, slot_ids,
        *strides, HV, Hk, V, K, L, L + 1 if min_room is None else int(min_room),
        float(K ** -0.5 if scale is None else scale),
        T=T, TP=max(2, next_pow2(T)), LP=max(16, next_pow2(L)), BV=bv, BK=max(16, next_pow2(K)),
        HPP=hpp, MODE=mode, ROUTE_STATE=bool(route_state), USE_L2=bool(use_qk_l2norm),
        CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
        ADVANCE=bool(advance) and mode != MODE_VERIFY,
        NPROG=nprog, TICKET=WP_TICKET, num_warps=nw, **extra,
    )
