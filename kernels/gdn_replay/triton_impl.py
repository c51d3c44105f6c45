"""Triton kernels of the Gated DeltaNet ReplaySSM backend (decode both routes, verify, flush).

One program = (batch row, HPP value heads sharing one key head, block of BV rows of V). The key
head's ring k, the window's normalised q/k and every dot product k_j.k_t, k_j.q_t are formed once
per program and shared by its HPP value heads. Per value head, with Gam = running sum of g:
  * adjoint (output-only) route: S0 k_t and S0 q_t in one pass over the S0 tile (or its
    low-precision copy), plus ring sums e^{G_t - Gam_j} (k_j.k_t) u_j and (k_j.q_t) u_j; window
    tokens are solved by forward substitution (u_s depends on u_r, r < s). Never forms S.
  * state route: S' = e^{G_t} S0 + (u * e^{G_t - Gam})^T k over the ring (fp32 `ieee` dot), then
    S' k_t, S' q_t. Costs L x the FLOPs of the adjoint route.
  * flush (both routes): the state-route rebuild from the fp32 checkpoint, finish the step on the
    tile (u_t, S_t = S' + u_t k_t^T), write ckpt (+ ckpt_lo). With u cached, the serial replay
    S <- e^{g_j} S + u_j k_j^T is exactly this one matmul.
The cursor moves with the same atomic ticket as the Mamba-2 kernel (see mamba2_replay).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..mamba2_replay.common import WP_TICKET, is_fp8, next_pow2
from ..mamba2_replay.triton_impl import _store_state

MODE_DECODE, MODE_VERIFY, MODE_FLUSH = 0, 1, 2


@triton.jit
def _gdn_replay_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    ru_ptr, rk_ptr, rg_ptr, wp_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, sid_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_h,
    sbt_b, sbt_t, sbt_h, so_b, so_t, so_h,
    HV, Hk, V, K, L, min_room, scale,
    T: tl.constexpr, TP: tl.constexpr, LP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    HPP: tl.constexpr, MODE: tl.constexpr, ROUTE_STATE: tl.constexpr, USE_L2: tl.constexpr,
    CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr, ADVANCE: tl.constexpr,
    NPROG: tl.constexpr, TICKET: tl.constexpr,
):
    row = tl.program_id(0)
    hc = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(sid_ptr + row).to(tl.int32)
    valid = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)

    # ---- cursor: atomic ticket in write_pos's high bits when this launch moves it ----
    MOVES: tl.constexpr = ADVANCE and (MODE != 1)
    if MOVES:
        old = tl.atomic_add(wp_ptr + slot64, TICKET, mask=valid)
        old = tl.where(valid, old, 0)
        wp = old & (TICKET - 1)
        last = ((old // TICKET) == NPROG - 1) & valid
    else:
        wp = tl.load(wp_ptr + slot64, mask=valid, other=0)
    if MODE == 0:
        flush = wp >= L - 1
        new_wp = tl.where(flush, 0, wp + 1)
    elif MODE == 2:
        flush = (wp > 0) & (wp + min_room > L) & valid
        new_wp = tl.where(flush, 0, wp)
    else:
        flush = wp < 0  # never
        new_wp = wp
    if MOVES:
        tl.atomic_xchg(wp_ptr + slot64, new_wp, mask=last)

    rep = HV // Hk
    hv0 = hc * HPP
    hk = hv0 // rep
    # masks from scalar limits (0 on a skipped row); see the Mamba-2 kernel for why
    offs_v = vb * BV + tl.arange(0, BV)
    vm = offs_v < tl.where(valid, V, 0)
    offs_k = tl.arange(0, BK)
    km = offs_k < tl.where(valid, K, 0)
    offs_l = tl.arange(0, LP)
    lm = offs_l < wp
    tile_mask = vm[:, None] & km[None, :]
    k_writer = ((hv0 % rep) == 0) & (vb == 0)  # one program per key head writes the ring's k

    # ---- key-head level, once per program: ring k, normalised q/k, every k_j.k_t and k_j.q_t ----
    rk = tl.load(rk_ptr + ((slot64 * Hk + hk) * L + offs_l[:, None]) * K + offs_k[None, :],
                 mask=lm[:, None] & km[None, :], other=0.0).to(tl.float32)              # [LP, BK]
    if MODE == 0:
        kt = tl.load(k_ptr + row * sk_b + hk * sk_h + offs_k, mask=km, other=0.0).to(tl.float32)
        qt = tl.load(q_ptr + row * sq_b + hk * sq_h + offs_k, mask=km, other=0.0).to(tl.float32)
        if USE_L2:
            kt = kt / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
            qt = qt / tl.sqrt(tl.sum(qt * qt, axis=0) + 1e-6)
        qt = qt * scale
        n_w = tl.where(valid & (wp < L - 1), 1, 0)  # a flushing step caches nothing
        tl.store(rk_ptr + ((slot64 * Hk + hk) * L + wp) * K + offs_k, kt.to(rk_ptr.dtype.element_ty),
                 mask=offs_k < tl.where(k_writer, n_w * K, 0))
        kq = tl.sum(kt * qt, axis=0)
        if not ROUTE_STATE:
            KKr = tl.sum(rk * kt[None, :], axis=1)                                          # [LP]
            KQr = tl.sum(rk * qt[None, :], axis=1)
    if MODE == 1:
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
        tl.store(rk_ptr + ((slot64 * Hk + hk) * L + wpos[:, None]) * K + offs_k[None, :],
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
        rg = tl.load(rg_ptr + ring_h * L + offs_l, mask=lm, other=0.0)                    # [LP] fp32
        Gam = tl.cumsum(rg, axis=0)
        tot = tl.sum(rg, axis=0)
        ru = tl.load(ru_ptr + (ring_h * L + offs_l[:, None]) * V + offs_v[None, :],
                     mask=lm[:, None] & vm[None, :], other=0.0).to(tl.float32)          # [LP, BV]
        st_off = ring_h * V * K + offs_v[:, None] * K + offs_k[None, :]
        row_off = ring_h * V
        if MODE == 2:
            if flush:
                er = tl.where(lm, tl.exp(tot - Gam), 0.0)
                S = tl.load(ck_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                if CK_FP8:
                    S = S * tl.load(cks_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                S = tl.exp(tot) * S + tl.dot(tl.trans(ru * er[:, None]), rk, input_precision="ieee")
                _store_state(ck_ptr, cks_ptr, st_off, row_off, S, offs_v, vm, tile_mask, CK_FP8)
                if HAS_LO:
                    _store_state(lo_ptr, los_ptr, st_off, row_off, S, offs_v, vm, tile_mask, LO_FP8)
        if MODE == 0:
            gt = tl.load(g_ptr + row * sg_b + hv * sg_h, mask=valid, other=0.0).to(tl.float32)
            bt = tl.load(beta_ptr + row * sbt_b + hv * sbt_h, mask=valid, other=0.0).to(tl.float32)
            vt = tl.load(v_ptr + row * sv_b + hv * sv_h + offs_v, mask=vm, other=0.0).to(tl.float32)
            Gt = tot + gt
            er = tl.where(lm, tl.exp(Gt - Gam), 0.0)
            if ROUTE_STATE:
                st_path = wp >= 0  # always
            else:
                st_path = flush
            if st_path:
                # rebuilt tile S' = e^{G_t} S0 + (u * e^{G_t - Gam})^T k : state route, and every flush
                if HAS_LO:
                    if flush:
                        S = tl.load(ck_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                        if CK_FP8:
                            S = S * tl.load(cks_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                    else:
                        S = tl.load(lo_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                        if LO_FP8:
                            S = S * tl.load(los_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                else:
                    S = tl.load(ck_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S = S * tl.load(cks_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                S = tl.exp(Gt) * S + tl.dot(tl.trans(ru * er[:, None]), rk, input_precision="ieee")
                ut = bt * (vt - tl.sum(S * kt[None, :], axis=1))
                if flush:
                    S = S + ut[:, None] * kt[None, :]
                    _store_state(ck_ptr, cks_ptr, st_off, row_off, S, offs_v, vm, tile_mask, CK_FP8)
                    if HAS_LO:
                        _store_state(lo_ptr, los_ptr, st_off, row_off, S, offs_v, vm, tile_mask, LO_FP8)
                    ot = tl.sum(S * qt[None, :], axis=1)
                else:
                    ot = tl.sum(S * qt[None, :], axis=1) + ut * kq
            else:
                # adjoint / output-only route: S0 k_t and S0 q_t in one pass, plus ring dot products
                if HAS_LO:
                    S0 = tl.load(lo_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if LO_FP8:
                        S0 = S0 * tl.load(los_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                else:
                    S0 = tl.load(ck_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                    if CK_FP8:
                        S0 = S0 * tl.load(cks_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
                eG = tl.exp(Gt)
                Sk = eG * tl.sum(S0 * kt[None, :], axis=1) + tl.sum((er * KKr)[:, None] * ru, axis=0)
                Sq = eG * tl.sum(S0 * qt[None, :], axis=1) + tl.sum((er * KQr)[:, None] * ru, axis=0)
                ut = bt * (vt - Sk)
                ot = Sq + ut * kq
            tl.store(o_ptr + row * so_b + hv * so_h + offs_v, ot.to(o_ptr.dtype.element_ty), mask=offs_v < V)
            tl.store(ru_ptr + (ring_h * L + wp) * V + offs_v, ut.to(ru_ptr.dtype.element_ty),
                     mask=offs_v < tl.where(n_w > 0, V, 0))
            tl.store(rg_ptr + ring_h * L + wp, gt, mask=(n_w > 0) & (vb == 0))
        if MODE == 1:
            gw = tl.load(g_ptr + row * sg_b + offs_t * sg_t + hv * sg_h, mask=tm, other=0.0).to(tl.float32)
            bw = tl.load(beta_ptr + row * sbt_b + offs_t * sbt_t + hv * sbt_h, mask=tm,
                         other=0.0).to(tl.float32)
            Gw = tot + tl.cumsum(gw, axis=0)                                             # [TP]
            vw = tl.load(v_ptr + row * sv_b + offs_t[:, None] * sv_t + hv * sv_h + offs_v[None, :],
                         mask=tm[:, None] & vm[None, :], other=0.0).to(tl.float32)      # [TP, BV]
            if HAS_LO:
                S0 = tl.load(lo_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                if LO_FP8:
                    S0 = S0 * tl.load(los_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
            else:
                S0 = tl.load(ck_ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
                if CK_FP8:
                    S0 = S0 * tl.load(cks_ptr + row_off + offs_v, mask=vm, other=0.0)[:, None]
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
                u_s = tl.sum(tl.where(sel, bw, 0.0), axis=0) * (tl.sum(tl.where(sel[:, None], vw, 0.0), axis=0) - Sk)
                o_s = Sq + u_s * tl.sum(tl.where(sel, KQs, 0.0), axis=0)
                U = tl.where(sel[:, None], u_s[None, :], U)
                tl.store(o_ptr + row * so_b + s * so_t + hv * so_h + offs_v,
                         o_s.to(o_ptr.dtype.element_ty), mask=offs_v < V)
            tl.store(ru_ptr + (ring_h * L + wpos[:, None]) * V + offs_v[None, :],
                     U.to(ru_ptr.dtype.element_ty), mask=wmask[:, None] & vm[None, :])
            tl.store(rg_ptr + ring_h * L + wpos, gw, mask=(offs_t < tl.where(vb == 0, T, 0)) & wmask)


def pick_config(batch: int, HV: int, V: int, rep: int, T: int = 1) -> tuple[int, int, int]:
    """(BLOCK_V, value heads per program, num_warps)."""
    bv = min(64, next_pow2(V))
    while bv > 16 and batch * HV * triton.cdiv(V, bv) < 1024:
        bv //= 2
    hpp = 1
    if batch * HV >= 4096:
        hpp = min(rep, 2)
    return max(bv, 16), hpp, 4


def launch(mode, ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, *, L, T, scale,
           use_qk_l2norm, route_state, ckpt_scale, ckpt_lo, ckpt_lo_scale, advance, min_room=None,
           config=None):
    slots, HV, V, K = ckpt.shape
    Hk = ring_k.shape[1]
    rep = HV // Hk
    b = slot_ids.shape[0]
    if b == 0:
        return
    bv, hpp, nw = config or pick_config(b, HV, V, rep, T)
    if rep % hpp:
        hpp = 1
    grid = (b, HV // hpp, triton.cdiv(V, bv))
    nprog = grid[1] * grid[2]
    assert nprog < (1 << 15)
    dummy = ckpt
    if mode == MODE_FLUSH:
        q = k = v = g = beta = o = dummy
        strides = (0,) * 18
    else:
        strides = tuple(t.stride(i) for t in (q, k, v, g, beta, o) for i in range(3))
    _gdn_replay_kernel[grid](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, o, slot_ids,
        *strides, HV, Hk, V, K, L, L + 1 if min_room is None else int(min_room),
        float(K ** -0.5 if scale is None else scale),
        T=T, TP=max(2, next_pow2(T)), LP=max(16, next_pow2(L)), BV=bv, BK=max(16, next_pow2(K)),
        HPP=hpp, MODE=mode, ROUTE_STATE=bool(route_state), USE_L2=bool(use_qk_l2norm),
        CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo), ADVANCE=bool(advance),
        NPROG=nprog, TICKET=WP_TICKET, num_warps=nw,
    )
