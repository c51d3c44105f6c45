"""Triton kernels of `quant_linear`: GEMV (M = 1) and skinny GEMM (M >= 2) straight from packed
block-quantized weights.

Weights stay in the layout `QTensor` stores (no conversion): codes [N, K/2] uint8 for 4-bit formats
(two per byte, even k in the low nibble), [N, K] for 8-bit; block scales [N, K/B] uint8 (E8M0 for MX,
E4M3 for NVFP4, whose FP32 per-tensor scale multiplies the accumulator once at the end).

Tiles are [BLOCK_N, G, H]: G = BLOCK_K / B scale blocks of H = B/2 code bytes (4-bit) or B codes
(8-bit), loaded as such, so each block scale broadcasts over its block without data movement. A
4-bit byte holds columns k (low nibble) and k+1 (high nibble); x is loaded as its even and odd
columns to match. Per K tile: x (times s, fp32; optionally fake-quantized to MXFP4 in-kernel: blocks
of 32, 'floor' E8M0 scale, E2M1 round-half-even — the same values as synodic.quant.fake_quant),
codes decoded to fp32 by bit manipulation (E2M1: the three magnitude bits shifted into an fp32
(sub)normal, times 2^126 — exact), then
  * GEMV: products summed within each scale block, times the block scale, accumulated [BLOCK_N, G];
  * GEMM: decoded weights times their scales, cast to the activation dtype (bf16 / fp16: exact for MX
    and for NVFP4 without its per-tensor scale; fp32 runs IEEE fp32), tl.dot with fp32 accumulation.
MXFP8 (E4M3 / E5M2, one code byte per weight, E8M0 scales of 32) takes the same two paths: the byte
decoded to fp32 (bit fields: sign, exponent, mantissa, subnormals, E4M3 0x7F/0xFF NaN, E5M2 Inf/NaN; or,
config FP8_CVT=True, bitcast to tl.float8e4nv / tl.float8e5 and the hardware conversion), the block
scale 2^(e - 127) applied as above, fp32 accumulation (E4M3 / E5M2 values times 2^e are exact in bf16
within its normal range).
Why not Hopper's FP8 tensor cores (tl.dot on fp8 operands) for 8-bit weights: the GEMV (M = 1) is
bandwidth-bound — one multiply-add per weight byte read, a tensor core has nothing to do there; and an
fp8 dot would need (a) the activations quantized to fp8 too (W8A8, not this weight-only W8A16 path)
with their own scales, (b) the per-(row, 32-block) E8M0 weight scales applied outside the MMA: one
tl.dot per 32-wide K block, its fp32 partial times the [BLOCK_M, 1] x-scale and the [1, BLOCK_N]
w-scale before accumulating (or tl.dot_scaled, which Hopper runs only as a bf16 emulation), with
BLOCK_M >= 16 tiles padded for M < 16. Worth it only for the M >= 16 GEMM path; not built.
SPLIT_K programs share one output tile's K range; their fp32 partials are summed on the host
(deterministic, no atomics). The launch config is a heuristic (no timing at run time, so decode
steps stay capturable in CUDA graphs); bench_quant.py sweeps alternatives.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FMT_IDS = {"mxfp4": 0, "nvfp4": 1, "mxfp8_e4m3": 2, "mxfp8_e5m2": 3}
_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + MAGIC) - MAGIC rounds |y| < 2^22 half-to-even in fp32
_TWO126 = tl.constexpr(8.507059173023462e37)  # 2^126


@triton.jit
def _e2m1(c):
    """int32 E2M1 codes (0..15) -> fp32: bits 2..0 at fp32 bits 24..22 give 2^-126 * |value| (code 1 is
    the subnormal 2^-127), the sign bit goes to bit 31; times 2^126 is exact."""
    bits = ((c & 7) << 22) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * _TWO126


@triton.jit
def _e4m3(c):
    """int32 E4M3fn codes (0..255) -> fp32."""
    e = (c >> 3) & 15
    m = c & 7
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return tl.where((c & 0x80) != 0, -mag, mag)


@triton.jit
def _e5m2(c):
    """int32 E5M2 codes (0..255) -> fp32."""
    e = (c >> 2) & 31
    m = c & 3
    mag = tl.where(e == 0, m.to(tl.float32) * 0.0000152587890625,
                   (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True))
    mag = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), mag)
    return tl.where((c & 0x80) != 0, -mag, mag)


@triton.jit
def _e8m0(c):
    """int32 E8M0 codes -> fp32 (0 -> 2^-127, 255 -> NaN), as synodic.quant.mx.e8m0_to_fp32."""
    v = tl.where(c == 0, 5.877471754111438e-39, (c << 23).to(tl.float32, bitcast=True))
    return tl.where(c == 255, float("nan"), v)


@triton.jit
def _mxfp4_round(v):
    """E2M1 grid, round-half-even, saturating at 6, NaN kept (v already divided by the block scale)."""
    av = tl.abs(v)
    e = tl.minimum(tl.maximum((av.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127), 129)
    ulp = ((e - 1) << 23).to(tl.float32, bitcast=True)  # 2^(e - mbits) with mbits = 1
    r = tl.minimum(((av / ulp + _MAGIC) - _MAGIC) * ulp, 6.0)
    r = tl.where(v < 0, -r, r)
    return tl.where(v != v, v, r)


@triton.jit
def _mxfp4_from_amax(x, amax):
    """MXFP4 fake quantization of x whose 32-block absolute max (broadcastable to x) is amax."""
    ebits = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    biased = tl.minimum(tl.maximum(ebits - 2, 0), 255)  # floor(log2 amax) - emax(E2M1)=2, E8M0-biased
    biased = tl.where(amax != amax, 255, biased)
    div = tl.maximum((biased << 23).to(tl.float32, bitcast=True), 1.1754943508222875e-38)
    return _mxfp4_round(x / div) * _e8m0(biased)


@triton.jit
def _mxfp4_fake_pair(xe, xo, AXIS: tl.constexpr):
    """x given as even / odd columns [..., G, 16] of G blocks of 32 (the 16 along AXIS, the last)."""
    amax = tl.maximum(tl.max(tl.abs(xe), axis=AXIS, keep_dims=True), tl.max(tl.abs(xo), axis=AXIS, keep_dims=True))
    return _mxfp4_from_amax(xe, amax), _mxfp4_from_amax(xo, amax)


@triton.jit
def _mxfp4_fake(x, AXIS: tl.constexpr):
    """x as [..., G, 32] blocks (the 32 along AXIS, the last)."""
    return _mxfp4_from_amax(x, tl.max(tl.abs(x), axis=AXIS, keep_dims=True))


@triton.jit
def _decode(codes, FMT: tl.constexpr, FP8_CVT: tl.constexpr = False):
    """int32 codes -> fp32 weights. 8-bit codes: bit-field arithmetic (default; exact, the same values as
    synodic.quant.elements' tables, NaN payloads aside), or with FP8_CVT the byte bitcast to
    tl.float8e4nv / tl.float8e5 and converted by the hardware (sm_89+; exact there too). The Triton 3.9
    interpreter's fp8 conversion is wrong for the special codes (E4M3 0x7F/0xFF give finite values, E5M2
    Inf/NaN codes too), so only the arithmetic decoder is tested bit for bit on CPU."""
    if FMT <= 1:
        return _e2m1(codes)
    elif FMT == 2:
        if FP8_CVT:
            return codes.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return _e4m3(codes)
    else:
        if FP8_CVT:
            return codes.to(tl.uint8).to(tl.float8e5, bitcast=True).to(tl.float32)
        return _e5m2(codes)


@triton.jit
def _scale(sc, FMT: tl.constexpr):
    if FMT == 1:
        return _e4m3(sc)
    else:
        return _e8m0(sc)


@triton.jit
def _qgemv_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, N, K, K_PER_SPLIT, stride_wn, stride_sn,
                  FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACT_Q: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  FP8_CVT: tl.constexpr):
    """y[n] = sum_k act(x[k] s[k]) w[n, k] for one row of x."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    PACKED: tl.constexpr = FMT <= 1
    G: tl.constexpr = BLOCK_K // QBLOCK
    H: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows = offs_n.to(tl.int64)
    offs_g = tl.arange(0, G)
    offs_h = tl.arange(0, H)
    k_lo = pid_k * K_PER_SPLIT
    g_hi = tl.minimum(k_lo + K_PER_SPLIT, K) // QBLOCK
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + K_PER_SPLIT, BLOCK_K):
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        m3 = mn[:, None, None] & mg[None, :, None]
        sc = tl.load(sc_ptr + rows[:, None] * stride_sn + g[None, :], mask=mn[:, None] & mg[None, :], other=0)
        sc = _scale(sc.to(tl.int32), FMT)
        if PACKED:
            col = (g * QBLOCK)[:, None] + 2 * offs_h[None, :]  # even columns, [G, H]
            xm = mg[:, None]
            xe = tl.load(x_ptr + col, mask=xm, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + col + 1, mask=xm, other=0.0).to(tl.float32)
            if HAS_S:
                xe = xe * tl.load(s_ptr + col, mask=xm, other=0.0)
                xo = xo * tl.load(s_ptr + col + 1, mask=xm, other=0.0)
            if ACT_Q == 1:
                xe, xo = _mxfp4_fake_pair(xe, xo, 1)
            byte = tl.load(w_ptr + rows[:, None, None] * stride_wn + (g * H)[None, :, None] + offs_h[None, None, :],
                           mask=m3, other=0).to(tl.int32)
            part = tl.sum(_e2m1(byte & 15) * xe[None, :, :] + _e2m1(byte >> 4) * xo[None, :, :], axis=2)
        else:
            col = (g * QBLOCK)[:, None] + offs_h[None, :]
            xm = mg[:, None]
            xv = tl.load(x_ptr + col, mask=xm, other=0.0).to(tl.float32)
            if HAS_S:
                xv = xv * tl.load(s_ptr + col, mask=xm, other=0.0)
            if ACT_Q == 1:
                xv = _mxfp4_fake(xv, 1)
            wcol = (g * QBLOCK)[None, :, None] + offs_h[None, None, :]
            codes = tl.load(w_ptr + rows[:, None, None] * stride_wn + wcol, mask=m3, other=0).to(tl.int32)
            part = tl.sum(_decode(codes, FMT, FP8_CVT) * xv[None, :, :], axis=2)
        acc += tl.where(mn[:, None] & mg[None, :], part * sc, 0.0)
    out = tl.sum(acc, axis=1)
    if FMT == 1:
        out = out * tl.load(p_ptr)
    if HAS_BIAS:
        if pid_k == 0:
            out += tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)
    if PARTIAL:
        tl.store(y_ptr + pid_k * N + offs_n, out, mask=mn)
    else:
        tl.store(y_ptr + offs_n, out.to(y_ptr.dtype.element_ty), mask=mn)


@triton.jit
def _qgemm_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, M, N, K, K_PER_SPLIT, stride_xm, stride_wn,
                  stride_sn,
                  FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACT_Q: tl.constexpr, PARTIAL: tl.constexpr, DOT_LOW: tl.constexpr, DOT_PREC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8_CVT: tl.constexpr):
    """y[m, n] = sum_k act(x[m, k] s[k]) w[n, k] for a tile of BLOCK_M rows (tl.dot)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    PACKED: tl.constexpr = FMT <= 1
    G: tl.constexpr = BLOCK_K // QBLOCK
    H: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = offs_m < M
    mn = offs_n < N
    rows_m = offs_m.to(tl.int64)
    rows_n = offs_n.to(tl.int64)
    offs_g = tl.arange(0, G)
    offs_h = tl.arange(0, H)
    k_lo = pid_k * K_PER_SPLIT
    g_hi = tl.minimum(k_lo + K_PER_SPLIT, K) // QBLOCK
    wdt: tl.constexpr = x_ptr.dtype.element_ty if DOT_LOW else tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + K_PER_SPLIT, BLOCK_K):
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        sc = tl.load(sc_ptr + rows_n[:, None] * stride_sn + g[None, :], mask=mn[:, None] & mg[None, :], other=0)
        sc = _scale(sc.to(tl.int32), FMT)[:, :, None]
        wm = mn[:, None, None] & mg[None, :, None]
        xm = mm[:, None, None] & mg[None, :, None]
        if PACKED:
            col = (g * QBLOCK)[None, :, None] + 2 * offs_h[None, None, :]  # [1, G, H] even columns
            xe = tl.load(x_ptr + rows_m[:, None, None] * stride_xm + col, mask=xm, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + rows_m[:, None, None] * stride_xm + col + 1, mask=xm, other=0.0).to(tl.float32)
            if HAS_S:
                xe = xe * tl.load(s_ptr + col, mask=mg[None, :, None], other=0.0)
                xo = xo * tl.load(s_ptr + col + 1, mask=mg[None, :, None], other=0.0)
            if ACT_Q == 1:
                xe, xo = _mxfp4_fake_pair(xe, xo, 2)
            byte = tl.load(w_ptr + rows_n[:, None, None] * stride_wn + (g * H)[None, :, None] + offs_h[None, None, :],
                           mask=wm, other=0).to(tl.int32)
            w_lo = tl.reshape(_e2m1(byte & 15) * sc, (BLOCK_N, G * H)).to(wdt)
            w_hi = tl.reshape(_e2m1(byte >> 4) * sc, (BLOCK_N, G * H)).to(wdt)
            acc = tl.dot(tl.reshape(xe, (BLOCK_M, G * H)).to(wdt), tl.trans(w_lo), acc, input_precision=DOT_PREC)
            acc = tl.dot(tl.reshape(xo, (BLOCK_M, G * H)).to(wdt), tl.trans(w_hi), acc, input_precision=DOT_PREC)
        else:
            col = (g * QBLOCK)[None, :, None] + offs_h[None, None, :]
            xv = tl.load(x_ptr + rows_m[:, None, None] * stride_xm + col, mask=xm, other=0.0).to(tl.float32)
            if HAS_S:
                xv = xv * tl.load(s_ptr + col, mask=mg[None, :, None], other=0.0)
            if ACT_Q == 1:
                xv = _mxfp4_fake(xv, 2)
            codes = tl.load(w_ptr + rows_n[:, None, None] * stride_wn + col, mask=wm, other=0).to(tl.int32)
            w = tl.reshape(_decode(codes, FMT, FP8_CVT) * sc, (BLOCK_N, G * H)).to(wdt)
            acc = tl.dot(tl.reshape(xv, (BLOCK_M, G * H)).to(wdt), tl.trans(w), acc, input_precision=DOT_PREC)
    if FMT == 1:
        acc = acc * tl.load(p_ptr)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)[None, :]
    out_mask = mm[:, None] & mn[None, :]
    if PARTIAL:
        tl.store(y_ptr + pid_k * M * N + rows_m[:, None] * N + offs_n[None, :], acc, mask=out_mask)
    else:
        tl.store(y_ptr + rows_m[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def block_m_for(M: int) -> int:
    """1 (the GEMV kernel) for one row, else a tl.dot tile of 16..64 rows."""
    return 1 if M == 1 else min(64, max(16, triton.next_power_of_2(M)))


def default_config(M: int, N: int, K: int, fmt: str, sms: int = 132) -> dict:
    """Heuristic launch config. GEMV: K split until ~16 programs per SM (the best of the sweep at 5 of
    the 6 H200 points measured). GEMM: the sweep's best H200 configs (bench_quant.py, 2026-11-29)."""
    packed = FMT_IDS[fmt] <= 1
    if block_m_for(M) == 1:
        bn, bk, warps, stages = 16, 256 if packed else 128, 4, 2
        progs, split = triton.cdiv(N, bn), 1
        while progs * split * 2 <= 16 * sms and K // (split * 2) >= bk:
            split *= 2
        return dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)
    bk = 128 if packed else 64
    if N >= 8192:
        return dict(BLOCK_N=128, BLOCK_K=bk, SPLIT_K=1, num_warps=8, num_stages=3)
    return dict(BLOCK_N=64, BLOCK_K=bk, SPLIT_K=2 if K >= 4 * bk else 1, num_warps=4, num_stages=3)


def quant_linear_triton(x2d: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None,
                        fmt: str, qblock: int, s: torch.Tensor | None, bias: torch.Tensor | None,
                        act_quant: str | None, config: dict | None = None) -> torch.Tensor:
    """x2d [M, K] -> [M, N] in x2d.dtype. act_quant='mxfp4' needs qblock 32 (the caller quantizes
    activations itself for NVFP4 weights)."""
    M, K = x2d.shape
    N = data.shape[0]
    cfg = dict(default_config(M, N, K, fmt, _sms(x2d.device)), **(config or {}))
    bm, bn, bk, split = block_m_for(M), cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    if bk % qblock or bk < 32 or bk & (bk - 1):
        raise ValueError(f"config BLOCK_K={bk}: expected a power of two >= 32, a multiple of the format block {qblock}")
    if act_quant is not None and qblock != 32:
        raise ValueError(f"act_quant={act_quant!r} in-kernel needs 32-blocks of weights, got {qblock}")
    k_per = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per)
    partial = split > 1
    y = (torch.empty(split, M, N, dtype=torch.float32, device=x2d.device) if partial
         else torch.empty(M, N, dtype=x2d.dtype, device=x2d.device))
    dummy = data
    args = (x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias, y)
    meta = dict(FMT=FMT_IDS[fmt], QBLOCK=qblock, HAS_S=s is not None, HAS_BIAS=bias is not None,
                ACT_Q=1 if act_quant == "mxfp4" else 0, PARTIAL=partial, BLOCK_N=bn, BLOCK_K=bk,
                FP8_CVT=bool(cfg.get("FP8_CVT", False)) and fmt.startswith("mxfp8"),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if bm == 1:
        _qgemv_kernel[(triton.cdiv(N, bn), split)](*args, N, K, k_per, data.stride(0), scale.stride(0), **meta)
    else:
        # the interpreter's bf16/fp16 tl.dot is wrong (Triton 3.9): fp32 there, exact for these operands
        low = x2d.dtype != torch.float32 and os.environ.get("TRITON_INTERPRET") != "1"
        _qgemm_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn), split)](
            *args, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0), DOT_LOW=low,
            DOT_PREC="tf32" if low else "ieee", BLOCK_M=bm, **meta)
    return y.sum(0).to(x2d.dtype) if partial else y


_SMS: dict = {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]
