"""Mamba-2 ReplaySSM speculative verify, per group: one program per (batch row, group, head split), looping over
the heads of the group.

Why a second verify kernel: the per-head kernel (``verify``) holds a whole [64, N] fp32 tile in the registers of
two warps and issues nothing else until its window products are done, so at batch 256 it moves the checkpoint at
about 1.85 TB/s (579 us a layer on the H200), while the decode kernel moves the same bytes at 3.4 TB/s. Here the
heads of a group share everything but their state: C, the ring's and the window's B, and so the products
B_j . C_s and B_r . C_s (formed once per program, no prologue launch), while the head loop is software-pipelined
(``num_stages``) so the next head's state tile is in flight during this head's arithmetic.

Per head h of the group, with c = A * cumsum(dt) over ring + window (ring j < wp, window r <= s):
    y[s] = e^{c_s} (S0 . C_s) + sum_j dt_j e^{c_s - c_j} (B_j . C_s) x_j + sum_{r<=s} dt_r e^{c_s - c_r}
           (B_r . C_s) x_r + D x_s                                                         (* silu(z_s) if z)
as three dots over the window axis padded to TD >= 16 rows (tl.dot's minimum): S0 . C as a tf32x3 dot (about
fp32 accuracy, as the per-head kernel's dot route) and the ring and window sums as fp32 (ieee) dots.
Token s is appended at ring[wp + s]: x and dt by every program for its heads, B by head split 0. write_pos and
the checkpoint are never written. Same arguments and results as ``verify.launch_verify``.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16, _slot_of, _softplus
from ..replay_common import is_fp8, next_pow2


@triton.jit
def _mamba2_verify_group_kernel(
    ck_ptr, cks_ptr, lo_ptr, los_ptr,
    rx_ptr, rdt_ptr, rB_ptr, wp_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, z_ptr, y_ptr, sid_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sy_b, sy_t, sy_h,
    sdt_b, sdt_t, sdt_h, sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr, T: tl.constexpr,
    TD: tl.constexpr, LP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, HSPLIT: tl.constexpr,
    STAGES: tl.constexpr, HAS_Z: tl.constexpr, CK_FP8: tl.constexpr, HAS_LO: tl.constexpr, LO_FP8: tl.constexpr,
    ROUND_RX: tl.constexpr, ROUND_RB: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    HPG: tl.constexpr = H // G
    HPS: tl.constexpr = HPG // HSPLIT              # heads of this program
    pid = tl.program_id(0)
    g = pid // HSPLIT
    hs = pid % HSPLIT
    row = tl.program_id(1).to(tl.int64)
    slot, valid = _slot_of(sid_ptr, row)

    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, BN)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TD)
    pm = offs_p < P
    nm = offs_n < N
    tm = offs_t < T
    tv = offs_t < tl.where(valid, T, 0)            # window rows of a real request
    wp = tl.load(wp_ptr + slot, mask=valid, other=0)
    lm = offs_l < wp                               # live ring entries (wp = 0 on a padding row)
    app = valid & (wp + T <= L)                    # the caller guarantees it; never write past L
    wpa = tl.where(app, wp, 0)
    ta = offs_t < tl.where(app, T, 0)              # window rows appended to the ring (masks from scalar limits)
    sg = slot * G + g

    # ---- group-level operands, once per program: C, the ring's and the window's B, their products ----
    tn = tm[:, None] & nm[None, :]
    Cw = tl.load(C_ptr + row * sC_b + g * sC_g + offs_t[:, None] * sC_t + offs_n[None, :], mask=tn,
                 other=0.0).to(tl.float32)                                                   # [TD, BN]
    Bw_raw = tl.load(B_ptr + row * sB_b + g * sB_g + offs_t[:, None] * sB_t + offs_n[None, :], mask=tn, other=0.0)
    Bw = Bw_raw.to(tl.float32)
    rB_base = rB_ptr + sg * L * N
    rB = tl.load(rB_base + offs_l[:, None] * N + offs_n[None, :], mask=(offs_l < L)[:, None] & nm[None, :],
                 other=0.0)
    rB = tl.where(lm[:, None], rB.to(tl.float32), 0.0)                                      # [LP, BN]
    BCr = tl.dot(Cw, tl.trans(rB), input_precision="ieee")                                   # [TD, LP]
    BCw = tl.dot(Cw, tl.trans(Bw), input_precision="ieee")                                   # [TD, TD]
    if ROUND_RB:
        Bw_raw = _round_bf16(Bw)
    tl.store(rB_base + (wpa + offs_t)[:, None] * N + offs_n[None, :], Bw_raw.to(rB_ptr.dtype.element_ty),
             mask=(offs_t < tl.where(app & (hs == 0), T, 0))[:, None] & nm[None, :])
    causal = offs_t[None, :] <= offs_t[:, None]                                              # [TD, TD]: r <= s

    tile_mask = pm[:, None] & nm[None, :]
    st_off = offs_p[:, None] * N + offs_n[None, :]
    tp = tm[:, None] & pm[None, :]
    for i in tl.range(0, HPS, num_stages=STAGES):
        h = g * HPG + hs * HPS + i
        sh = slot * H + h
        # ---- the big read: this head's state tile (or its low-precision copy) ----
        if HAS_LO:
            S0 = tl.load(lo_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
            if LO_FP8:
                S0 = S0 * tl.load(los_ptr + sh * P + offs_p, mask=pm, other=0.0)[:, None]
        else:
            S0 = tl.load(ck_ptr + sh * P * N + st_off, mask=tile_mask, other=0.0).to(tl.float32)
            if CK_FP8:
                S0 = S0 * tl.load(cks_ptr + sh * P + offs_p, mask=pm, other=0.0)[:, None]
        xr = tl.load(rx_ptr + (sh * L + offs_l[:, None]) * P + offs_p[None, :],
                     mask=(offs_l < L)[:, None] & pm[None, :], other=0.0)                    # [LP, BP]
        dtr = tl.load(rdt_ptr + sh * L + offs_l, mask=offs_l < L, other=0.0)
        xw_raw = tl.load(x_ptr + row * sx_b + h * sx_h + offs_t[:, None] * sx_t + offs_p[None, :], mask=tp,
                         other=0.0)                                                          # [TD, BP]
        vw = tl.load(dt_ptr + row * sdt_b + h * sdt_h + offs_t * sdt_t, mask=tm, other=0.0).to(tl.float32)
        A_h = tl.load(A_ptr + h).to(tl.float32)
        D_h = tl.load(D_ptr + h).to(tl.float32)
        bias_h = tl.load(bias_ptr + h).to(tl.float32)

        SC = tl.dot(Cw, tl.trans(S0), input_precision="tf32x3")                              # [TD, BP]
        # where, not * 0: ring entries past the cursor may be stale or NaN
        dtr = tl.where(lm, dtr, 0.0)
        xr = tl.where(lm[:, None], xr.to(tl.float32), 0.0)
        xw = xw_raw.to(tl.float32)
        dtw = tl.where(tv, _softplus(vw + bias_h), 0.0)                                      # [TD]
        cum_r = tl.cumsum(dtr, axis=0)
        tot = tl.sum(dtr, axis=0)
        cum_w = tl.cumsum(dtw, axis=0)
        cs = A_h * (tot + cum_w)                                                             # [TD]: c_s
        wr = tl.where(lm[None, :], dtr[None, :] * tl.exp(cs[:, None] - A_h * cum_r[None, :]) * BCr, 0.0)
        ww = tl.where(causal, dtw[None, :] * tl.exp(A_h * (cum_w[:, None] - cum_w[None, :])) * BCw, 0.0)
        yv = (tl.exp(cs)[:, None] * SC + tl.dot(wr, xr, input_precision="ieee")
              + tl.dot(ww, xw, input_precision="ieee") + D_h * xw)
        if HAS_Z:
            zs = tl.load(z_ptr + row * sz_b + h * sz_h + offs_t[:, None] * sz_t + offs_p[None, :], mask=tp,
                         other=0.0).to(tl.float32)
            yv = yv * (zs * tl.sigmoid(zs))
        yv = tl.where(valid, yv, 0.0)
        if ROUND_OUT:
            yv = _round_bf16(yv)
        tl.store(y_ptr + row * sy_b + h * sy_h + offs_t[:, None] * sy_t + offs_p[None, :],
                 yv.to(y_ptr.dtype.element_ty), mask=tp)
        # ---- ring entries wp + s of this head: x and dt ----
        if ROUND_RX:
            xw_raw = _round_bf16(xw)
        tl.store(rx_ptr + (sh * L + wpa + offs_t[:, None]) * P + offs_p[None, :],
                 xw_raw.to(rx_ptr.dtype.element_ty), mask=ta[:, None] & pm[None, :])
        tl.store(rdt_ptr + sh * L + wpa + offs_t, dtw, mask=ta)


def pick_group_config(batch: int, H: int, G: int) -> tuple[int, int, int]:
    """(num_warps, num_stages, head splits) for the per-group verify."""
    hpg = H // G
    split = 1
    # heads split over programs until ~512 programs run (nemotron_h_8b at batch 32 on the H100, 4 warps and 2
    # stages: 2 splits 112 us, 4 splits 132, none 134); at batch 256: (4, 3) 630 us, (4, 2) 688, (8, 3) 900
    # (docs/tuning/replay.md)
    while split < hpg and batch * G * split < 512 and hpg % (2 * split) == 0:
        split *= 2
    return 4, 3, split


def launch_verify_group(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z, y, *,
                        L, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, config=None):
    """As ``verify.launch_verify``; config = (num_warps, num_stages[, head splits]) (default `pick_group_config`)."""
    slots, H, P, N = ckpt.shape
    G = ring_B.shape[1]
    b, T = x.shape[0], x.shape[1]
    if b == 0 or T == 0:
        return y
    nw, stages, split = pick_group_config(b, H, G)
    if config is not None:
        cfg = tuple(config)
        if not 2 <= len(cfg) <= 3:
            raise ValueError(f"config: impl='group' takes (num_warps, num_stages[, head splits]), got {cfg!r}")
        nw, stages = int(cfg[0]), int(cfg[1])
        split = int(cfg[2]) if len(cfg) > 2 else split
    if (H // G) % split:
        raise ValueError(f"config: head splits must divide the {H // G} heads of a group, got {split}")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    zz = z if z is not None else x
    dummy = ckpt
    _mamba2_verify_group_kernel[(G * split, b)](
        ckpt, ckpt_scale if ckpt_scale is not None else dummy,
        ckpt_lo if ckpt_lo is not None else dummy, ckpt_lo_scale if ckpt_lo_scale is not None else dummy,
        ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, zz, y, slot_ids,
        x.stride(0), x.stride(1), x.stride(2), zz.stride(0), zz.stride(1), zz.stride(2),
        y.stride(0), y.stride(1), y.stride(2), dt.stride(0), dt.stride(1), dt.stride(2),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        H=H, G=G, P=P, N=N, L=L, T=T, TD=max(16, next_pow2(T)), LP=max(16, next_pow2(L)),
        BP=max(16, next_pow2(P)), BN=max(16, next_pow2(N)), HSPLIT=split, STAGES=stages,
        HAS_Z=z is not None, CK_FP8=is_fp8(ckpt), HAS_LO=ckpt_lo is not None, LO_FP8=is_fp8(ckpt_lo),
        ROUND_RX=interp and ring_x.dtype == torch.bfloat16 and x.dtype != torch.bfloat16,
        ROUND_RB=interp and ring_B.dtype == torch.bfloat16 and B.dtype != torch.bfloat16,
        ROUND_OUT=interp and y.dtype == torch.bfloat16, num_warps=nw,
    )
    return y
