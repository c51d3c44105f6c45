"""Triton kernels of `quant_linear`: GEMV (M = 1, 2) and skinny GEMM (M >= 3) straight from packed
block-quantized weights.

Weights stay in the layout `QTensor` stores (no conversion): codes [N, K/2] uint8 for 4-bit formats
(two per byte, even k in the low nibble), [N, K] for 8-bit; block scales [N, K/B] uint8 (E8M0 for MX,
E4M3 for NVFP4, whose FP32 per-tensor scale multiplies the accumulator once at the end). Activations:
x times s (fp32), optionally fake-quantized to MXFP4 in-kernel (blocks of 32, 'floor' E8M0 scale, E2M1
round-half-even — the same values as synodic.quant.fake_quant).

Four kernels, picked by config KERNEL:
  * "gemvh" (CUDA cores, one or two rows; the default for M <= 2 with bf16 / fp16 activations; gemvh.py): fp16x2
    FMAs on weights decoded into fp16 halves, activations scaled per block into fp16 range; 2.1-2.3x bf16 for
    MXFP4 at M = 1 on the H200, ~1.5x at M = 2;
  * "dotp" (any M; the default for M >= 3; `_qdotp_kernel`): codes decoded straight to bf16 in the MMA operand
    layout, K permuted inside a tile (see the note above the kernel); 0.63-0.94x bf16 at M = 32 on the H200;
  * "dot" (any M; `_qdot_kernel`; the M >= 2 default until dotp): the decoded weight tile is the left tl.dot
    operand, bf16 MMA (fp32 IEEE for fp32 activations), M = 1 padded to a 16-row tile;
  * "gemv32" (CUDA cores, one row; the default for one row of fp32 activations; `_qgemv32_kernel`): the code
    bytes viewed as int32 words (8 nibbles / 4 bytes per word), two codes decoded per few integer ops, fp32 FMAs
    with x, block sums times the scale; see above it; 1.03-1.47x bf16.
Rows > 1 asked of gemv32 take the M >= 2 default. Decoding is exact bit manipulation (see `_bits_lo`); MXFP8
(E4M3 / E5M2) may instead use the hardware fp8 conversion in "dot" (config FP8_CVT=True).
SPLIT_K programs share one output tile's K range; the last one to finish sums the fp32 partials in split
order (`_store_out`: deterministic, no second launch). The launch config is a heuristic (no timing at
run time, so decode steps stay capturable in CUDA graphs); `python -m benchmarks.quant_linear` sweeps.

Why not Hopper's FP8 tensor cores (tl.dot on fp8 operands) for 8-bit weights: the GEMV (M = 1) is
bandwidth-bound — one multiply-add per weight byte read, a tensor core has nothing to do there; and an
fp8 dot would need (a) the activations quantized to fp8 too (W8A8, not this weight-only W8A16 path)
with their own scales, (b) the per-(row, 32-block) E8M0 weight scales applied outside the MMA: one
tl.dot per 32-wide K block, its fp32 partial times the [BLOCK_M, 1] x-scale and the [1, BLOCK_N]
w-scale before accumulating (or tl.dot_scaled, which Hopper runs only as a bf16 emulation), with
BLOCK_M >= 16 tiles padded for M < 16. Worth it only for the M >= 16 GEMM path; not built.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import tuned
from .codec import _SIGN2, _decode, _e4m3, _e8m0, _mxfp4_fake, _mxfp4_from_amax, _scale, _shl, _store_out
from .gemvh import _qgemvh_kernel, gemvh_omul

FMT_IDS = {"mxfp4": 0, "nvfp4": 1, "mxfp8_e4m3": 2, "mxfp8_e5m2": 3}


# --- decode, output, kernels -----------------------------------------------------------------------------------
#
# Decode without per-weight exponent fix-ups: a code's bits are shifted into an fp32 word whose value is the
# code's value times 2^-R (R = 126 for E2M1, 120 for E4M3, 112 for E5M2; subnormal codes land on fp32
# subnormals, so this is exact: 3 integer ops per weight). The missing 2^R and the block scale are one fp32
# multiply per weight (dot path: `_fold` makes 2^(R - DSH) * scale per block, so the weight reaches tl.dot as
# value * 2^-DSH and the accumulator is multiplied by 2^DSH once; DSH = 64 keeps every fp32 factor normal for
# E8M0 scales 2^-61 .. 2^65 — all real weights — and bf16 holds value * 2^-64 exactly), or, in the CUDA-core
# GEMV, no per-weight multiply at all: x is pre-multiplied by 2^(R - DSH) once per tile and the block scale
# multiplies the block's partial sum.

_DSH = 64


@triton.jit
def _bits_lo(b):
    """int32 bytes -> fp32 = E2M1(low nibble) * 2^-126 (exact; code 1 is the fp32 subnormal 2^-127)."""
    return (((b & 7) << 22) | ((b & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _bits_hi(b):
    """int32 bytes -> fp32 = E2M1(high nibble) * 2^-126."""
    return (((b << 18) & 0x1C00000) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _bits8(c, FMT: tl.constexpr, FP8_CVT: tl.constexpr):
    """int32 8-bit codes -> fp32 = value * 2^-R: E4M3 R=120 (NaN codes 0x7F/0xFF kept), E5M2 R=112 (Inf/NaN
    kept); with FP8_CVT the hardware conversion, R=0."""
    if FP8_CVT:
        return _decode(c, FMT, True)
    elif FMT == 2:
        v = (((c & 0x7F) << 20) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)
        return tl.where((c & 0x7F) == 0x7F, float("nan"), v)
    else:
        v = (((c & 0x7F) << 21) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)
        sp = tl.where((c & 3) == 0, float("inf"), float("nan"))
        return tl.where((c & 0x7C) == 0x7C, tl.where((c & 0x80) != 0, -sp, sp), v)


@triton.jit
def _fold(sc, FMT: tl.constexpr, SH: tl.constexpr, SHMUL: tl.constexpr):
    """int32 block-scale codes -> fp32 scale * 2^SH (SH >= 0, SHMUL = 2^SH). E8M0: built from the exponent
    field (NaN code kept, overflow -> inf, which needs a scale >= 2^(128 - SH): none in real weights)."""
    if FMT == 1:
        v = _e4m3(sc)
        if SH != 0:
            v = v * SHMUL
        return v
    elif SH == 0:
        return _e8m0(sc)
    else:
        v = (tl.minimum(sc + SH, 255) << 23).to(tl.float32, bitcast=True)
        return tl.where(sc == 255, float("nan"), v)


@triton.jit
def _dot_tile(M, N, K, K_PER_SPLIT, QBLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A dot program's output tile (grid: N tiles, K splits, M tiles) and its K range: program ids, N offsets /
    mask / int64 rows, the same for M, the split's [k_lo, k_hi) and its last scale block g_hi."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    return (pid_n, pid_k, pid_m, offs_n, offs_n < N, offs_n.to(tl.int64), offs_m, offs_m < M, offs_m.to(tl.int64),
            k_lo, k_hi, k_hi // QBLOCK)


@triton.jit
def _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_n, pid_k, pid_m,
                  FMT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, SEM: tl.constexpr,
                  OMUL: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] times 2^DSH (OMUL) and NVFP4's tensor scale, + bias (first split), stored as y[m, n]."""
    acc = acc * OMUL
    if FMT == 1:
        acc = acc * tl.load(p_ptr)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)[:, None]
    off = rows_m[None, :] * N + offs_n[:, None]
    _store_out(acc, y_ptr, part_ptr, cnt_ptr, off, off, mn[:, None] & mm[None, :], pid_k,
               pid_m * tl.num_programs(0) + pid_n, M * N, SPLIT, SEM)


@triton.jit
def _qdot_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, K_PER_SPLIT,
                 stride_xm, stride_wn, stride_sn,
                 FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                 ACT_Q: tl.constexpr, SPLIT: tl.constexpr, SEM: tl.constexpr, DOT_DT: tl.constexpr,
                 DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FP8_CVT: tl.constexpr, TWO_MUL: tl.constexpr, RMUL: tl.constexpr, SH: tl.constexpr,
                 SHMUL: tl.constexpr, OMUL: tl.constexpr):
    """y[m, n] = sum_k act(x[m, k] s[k]) w[n, k]: acc[BLOCK_N, BLOCK_M] = dot(W tile, x tile^T). The weight
    is the left operand (Hopper's wgmma can read it from registers, where it was decoded; x^T, small, goes
    through shared memory), so BLOCK_N >= 64 fills the MMA's M side and BLOCK_M = 16 rows (M = 1 padded) its
    narrow N side. Codes are loaded as [BLOCK_N, G, H] (a row's BLOCK_K/2 packed bytes contiguous, vector
    loads; the block scale broadcasts over its H bytes), decoded, and the two nibbles joined back into k
    order ([.., 2] -> reshape), which keeps each k pair in one thread as the MMA operand wants."""
    PACKED: tl.constexpr = FMT <= 1
    G: tl.constexpr = BLOCK_K // QBLOCK
    H: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK
    pid_n, pid_k, pid_m, offs_n, mn, rows_n, offs_m, mm, rows_m, k_lo, k_hi, g_hi = _dot_tile(
        M, N, K, K_PER_SPLIT, QBLOCK, BLOCK_M, BLOCK_N)
    offs_g = tl.arange(0, G)
    offs_h = tl.arange(0, H)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        sc = tl.load(sc_ptr + rows_n[:, None] * stride_sn + g[None, :], mask=mn[:, None] & mg[None, :], other=0)
        if TWO_MUL:  # exact for any scale: (bits * 2^R) * scale
            f = _scale(sc.to(tl.int32), FMT)[:, :, None]
        else:
            f = _fold(sc.to(tl.int32), FMT, SH, SHMUL)[:, :, None]
        byte = tl.load(w_ptr + rows_n[:, None, None] * stride_wn + (g * H)[None, :, None] + offs_h[None, None, :],
                       mask=mn[:, None, None] & mg[None, :, None], other=0).to(tl.int32)
        if PACKED:
            lo = _bits_lo(byte)
            hi = _bits_hi(byte)
            if TWO_MUL:
                lo = lo * RMUL
                hi = hi * RMUL
            w = tl.reshape(tl.join((lo * f).to(DOT_DT), (hi * f).to(DOT_DT)), (BLOCK_N, BLOCK_K))
        else:
            wv = _bits8(byte, FMT, FP8_CVT)
            if TWO_MUL:
                wv = wv * RMUL
            w = tl.reshape((wv * f).to(DOT_DT), (BLOCK_N, BLOCK_K))
        kk = k0 + offs_k
        mk = kk < k_hi
        xt = tl.load(x_ptr + rows_m[None, :] * stride_xm + kk[:, None], mask=mk[:, None] & mm[None, :],
                     other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_M]
        if HAS_S:
            xt = xt * tl.load(s_ptr + kk, mask=mk, other=0.0)[:, None]
        if ACT_Q == 1:
            x3 = tl.reshape(xt, (BLOCK_K // 32, 32, BLOCK_M))
            xt = tl.reshape(_mxfp4_from_amax(x3, tl.max(tl.abs(x3), axis=1, keep_dims=True)), (BLOCK_K, BLOCK_M))
        acc = tl.dot(w, xt.to(DOT_DT), acc, input_precision=DOT_PREC)
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_n, pid_k, pid_m,
                  FMT, HAS_BIAS, SPLIT, SEM, OMUL)


# --- gemv32: the GEMV from int32 code words ---------------------------------------------------------------------
#
# The code bytes [N, K/2] (4-bit) or [N, K] (8-bit) are read as int32 words [N, K/8] / [N, K/4] (a view, the
# stored layout unchanged): E = 8 nibbles or 4 bytes per word, code i of a word at bits i * 32/E, i.e. the word
# holds k .. k + E - 1 in order. A tile is [BLOCK_N, BLOCK_K / E] words (one 2-D load, contiguous along K),
# seen as [BLOCK_N, G, WPB] (WPB = B / E words per scale block). Decoding pairs codes i and i + E/2, which sit
# 16 bits apart: the same two shifts move code i's magnitude and sign into a bf16 bit pattern in the word's low
# half and code i + E/2's into the high half (`_pair32`: shift, shift, and, and-or), and each half becomes an
# fp32 (value * 2^-R, exactly the `_bits_lo` / `_bits8` words) with one more op: ~6 integer instructions per
# two weights once and-or pairs fuse (LOP3), against ~4 per weight plus byte unpacking for byte tiles (unchecked
# in SASS; benchmarks.quant_linear probes the bare loads). x is loaded as [G, B], times s and 2^(R - DSH) (the decoded
# value * 2^-R times 2^R; DSH goes back on the sum), split in registers into the E [G, WPB] slices that meet
# code i of each word. Per word:
# E FMAs into a [BLOCK_N, G, WPB] accumulator, times the block scale; summed once after the K loop.

_HI16 = tl.constexpr(-65536)  # 0xFFFF0000
_E4M3_NAN = tl.constexpr(1.875 * 2.0 ** -112)  # the fp32 word of E4M3 magnitude bits 0x7F (a NaN code)
_E5M2_TOP = tl.constexpr(2.0 ** -96)  # E5M2 exponent field all ones, mantissa 0, times 2^-112


@triton.jit
def _e5m2_special(v):
    """fp32 E5M2 words (value * 2^-112) whose exponent field is all ones (>= 2^-96 here) -> +-Inf (mantissa 0)
    or NaN."""
    a = tl.abs(v)
    sp = tl.where(a == _E5M2_TOP, tl.where(v < 0, -float("inf"), float("inf")), float("nan"))
    return tl.where(a >= _E5M2_TOP, sp, v)


@triton.jit
def _pair32(w, J: tl.constexpr, FMT: tl.constexpr):
    """int32 code words -> (code J, code J + E/2) of each word as fp32 value * 2^-R (R = 126 E2M1, 120 E4M3,
    112 E5M2; exact, subnormal codes land on fp32 subnormals; E4M3 0x7F/0xFF NaN, E5M2 Inf/NaN kept)."""
    if FMT <= 1:  # E2M1 nibbles at bits 4J and 4J + 16: magnitude -> bf16 bits 6..8, sign -> 15
        p = (_shl(w, 6 - 4 * J) & 0x01C001C0) | (_shl(w, 12 - 4 * J) & _SIGN2)
    elif FMT == 2:  # E4M3 bytes at bits 8J and 8J + 16: magnitude -> bits 4..10
        p = (_shl(w, 4 - 8 * J) & 0x07F007F0) | (_shl(w, 8 - 8 * J) & _SIGN2)
    else:  # E5M2: magnitude -> bits 5..11
        p = (_shl(w, 5 - 8 * J) & 0x0FE00FE0) | (_shl(w, 8 - 8 * J) & _SIGN2)
    lo = (p << 16).to(tl.float32, bitcast=True)
    hi = (p & _HI16).to(tl.float32, bitcast=True)
    if FMT == 2:  # magnitude code 0x7F = 1.875 * 2^-112 here: NaN
        lo = tl.where(tl.abs(lo) == _E4M3_NAN, float("nan"), lo)
        hi = tl.where(tl.abs(hi) == _E4M3_NAN, float("nan"), hi)
    elif FMT == 3:
        lo = _e5m2_special(lo)
        hi = _e5m2_special(hi)
    return lo, hi


@triton.jit
def _qgemv32_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, N, K, K_PER_SPLIT,
                    stride_wn, stride_sn,
                    FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                    ACT_Q: tl.constexpr, SPLIT: tl.constexpr, SEM: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, XMUL: tl.constexpr, OMUL: tl.constexpr):
    """CUDA-core GEMV for one row from int32 code words (w_ptr: int32, stride_wn in words)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    E: tl.constexpr = 8 if FMT <= 1 else 4  # codes per word
    G: tl.constexpr = BLOCK_K // QBLOCK
    WPB: tl.constexpr = QBLOCK // E
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows = offs_n.to(tl.int64)
    offs_g = tl.arange(0, G)
    offs_w = tl.arange(0, BLOCK_K // E)
    offs_q = tl.arange(0, QBLOCK)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    g_hi = k_hi // QBLOCK
    acc = tl.zeros((BLOCK_N, G, WPB), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        sc = tl.load(sc_ptr + rows[:, None] * stride_sn + g[None, :], mask=mn[:, None] & mg[None, :], other=0)
        sc = _scale(sc.to(tl.int32), FMT)
        cw = k0 // E + offs_w
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cw[None, :], mask=mn[:, None] & (cw < k_hi // E)[None, :],
                    other=0)
        w = tl.reshape(w, (BLOCK_N, G, WPB))
        col = (g * QBLOCK)[:, None] + offs_q[None, :]
        xm = mg[:, None]
        xv = tl.load(x_ptr + col, mask=xm, other=0.0).to(tl.float32)  # [G, QBLOCK]
        if HAS_S:
            xv = xv * tl.load(s_ptr + col, mask=xm, other=0.0)
        if ACT_Q == 1:
            xv = _mxfp4_fake(xv, 1)
        xv = xv * XMUL
        if FMT <= 1:  # k = 8 word + 4 h + 2 b1 + b0; pair J = 2 b1 + b0 meets x[J] (h = 0) and x[J + 4] (h = 1)
            xa, xb = tl.split(tl.reshape(xv, (G, WPB, 2, 2, 2)))
            x0h, x2h = tl.split(xa)
            x1h, x3h = tl.split(xb)
            x0, x4 = tl.split(x0h)
            x1, x5 = tl.split(x1h)
            x2, x6 = tl.split(x2h)
            x3, x7 = tl.split(x3h)
            lo, hi = _pair32(w, 0, FMT)
            part = lo * x0[None, :, :] + hi * x4[None, :, :]
            lo, hi = _pair32(w, 1, FMT)
            part += lo * x1[None, :, :] + hi * x5[None, :, :]
            lo, hi = _pair32(w, 2, FMT)
            part += lo * x2[None, :, :] + hi * x6[None, :, :]
            lo, hi = _pair32(w, 3, FMT)
            part += lo * x3[None, :, :] + hi * x7[None, :, :]
        else:  # k = 4 word + 2 h + b0; pair J = b0 meets x[J] and x[J + 2]
            xa, xb = tl.split(tl.reshape(xv, (G, WPB, 2, 2)))
            x0, x2 = tl.split(xa)
            x1, x3 = tl.split(xb)
            lo, hi = _pair32(w, 0, FMT)
            part = lo * x0[None, :, :] + hi * x2[None, :, :]
            lo, hi = _pair32(w, 1, FMT)
            part += lo * x1[None, :, :] + hi * x3[None, :, :]
        acc += part * sc[:, :, None]
    out = tl.sum(tl.sum(acc, axis=2), axis=1) * OMUL
    if FMT == 1:
        out = out * tl.load(p_ptr)
    if HAS_BIAS:
        if pid_k == 0:
            out += tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)
    _store_out(out, y_ptr, part_ptr, cnt_ptr, offs_n, offs_n, mn, pid_k, pid_n, N, SPLIT, SEM)


# --- dotp: tl.dot on weights decoded straight to bf16 in the MMA operand layout -------------------------------
#
# Why not "dot": its decode goes code -> fp32 (~3 integer ops) -> times the folded scale -> bf16 pack, then a
# join + reshape puts the two nibbles back in k order, and the code bytes reach the MMA operand registers one LDS.S8
# at a time: ~9-15 SASS instructions per weight in the K loop (offline sm_90 count). Here:
#  * K order is free in a contraction, so the two nibbles of a byte feed two dots (low nibbles against x at even
#    k, high ones against odd k): the decode stays elementwise on the byte tile;
#  * K is also permuted inside a tile (`_kperm`) so that what the wgmma A operand hands one thread (k pairs, the
#    +8 half, the 16-wide k steps) is 16 consecutive code bytes of a row: Triton carries the operand layout back
#    through the permute to the load (cp.async, then LDS.128, no byte shuffles); x, tiny, is loaded plainly and
#    permuted the same way (`_xperm`), so the dot is unchanged;
#  * codes become bf16 bit patterns 4 bytes per inline-asm call, two weights per 32-bit register (`_dec_asm`):
#    E2M1 magnitude -> bf16 bits 6..8, sign -> 15 (value * 2^-126, code 1 the bf16 subnormal 2^-127); E4M3 / E5M2
#    magnitude -> bits 4..10 / 5..11 (value * 2^-120 / 2^-112), all exact; then one bf16x2 multiply (HMUL2) per two
#    weights by the block scale * 2^(R - 64), built from the scale code's bits: the operand is value * scale * 2^-64
#    (exact in bf16 for E8M0 scales 2^-61 .. 2^65, any E4M3 scale), and the fp32 accumulator gets 2^64 once.
# Not kept exact (documented in resolve_config): 8-bit NaN / Inf codes decode finite (the quantizer writes none for
# finite weights) and the E8M0 NaN scale code 255 reads as Inf. On the interpreter (no inline asm) or for fp16 /
# fp32 activations the same bit patterns go through fp32: operands in fp32, an IEEE fp32 dot (exact, slow).


@triton.jit
def _dec_asm(b, FMT: tl.constexpr):
    """uint8 code bytes -> bf16 bit patterns, 4 bytes per asm call (prmt spreads bytes into 16-bit halves). 4-bit:
    (low nibble, high nibble) = E2M1 * 2^-126, per two weights and / multiply (magnitude << 6 plus sign << 12) /
    and; E4M3: one value, sign-replicating prmt, arithmetic shift, and."""
    if FMT <= 1:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 a, c, u;
            prmt.b32 a, $4, 0, 0x4140;
            prmt.b32 c, $4, 0, 0x4342;
            and.b32 u, a, 0x000F000F; mul.lo.u32 u, u, 0x1040; and.b32 $0, u, 0x81C081C0;
            and.b32 u, c, 0x000F000F; mul.lo.u32 u, u, 0x1040; and.b32 $1, u, 0x81C081C0;
            and.b32 u, a, 0x00F000F0; mul.lo.u32 u, u, 0x104; and.b32 $2, u, 0x81C081C0;
            and.b32 u, c, 0x00F000F0; mul.lo.u32 u, u, 0x104; and.b32 $3, u, 0x81C081C0;
            }""",
            constraints="=r,=r,=r,=r,r", args=[b], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    elif FMT == 2:  # [0, e0, sign(e0) x 8, e1] >> 4: sign at 15, magnitude at 4..10 (and the same for e2, e3)
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 a, c;
            prmt.b32 a, $2, 0, 0x1804; prmt.b32 c, $2, 0, 0x3A24;
            shr.s32 a, a, 4; shr.s32 c, c, 4;
            and.b32 $0, a, 0x87F087F0; and.b32 $1, c, 0x87F087F0;
            }""",
            constraints="=r,=r,r", args=[b], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 a, c;
            prmt.b32 a, $2, 0, 0x1804; prmt.b32 c, $2, 0, 0x3A24;
            shr.s32 a, a, 3; shr.s32 c, c, 3;
            and.b32 $0, a, 0x8FE08FE0; and.b32 $1, c, 0x8FE08FE0;
            }""",
            constraints="=r,=r,r", args=[b], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _dec_ref(b, FMT: tl.constexpr):
    """`_dec_asm`'s bf16 bit patterns in plain Triton (int32, one code per op chain), for the fp32-operand path."""
    c = b.to(tl.int32)
    if FMT <= 1:
        return ((c & 7) << 6) | ((c & 8) << 12), ((c & 0x70) << 2) | ((c & 0x80) << 8)
    elif FMT == 2:
        return ((c & 0x7F) << 4) | ((c & 0x80) << 8)
    else:
        return ((c & 0x7F) << 5) | ((c & 0x80) << 8)


@triton.jit
def _wide(bits):
    """bf16 bit patterns (int32) -> the same value in fp32, exactly (subnormals too: the interpreter's bf16 ->
    fp32 conversion flushes them)."""
    return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def _fold16(sc, FMT: tl.constexpr, SH: tl.constexpr, SHMUL: tl.constexpr, DT: tl.constexpr):
    """uint8 block-scale codes -> scale * 2^SH in DT (bf16: E8M0 straight into the exponent bits, 255 -> Inf;
    E4M3 through fp32; fp32: `_fold`). Exact for the scales of the "dotp" note."""
    if DT == tl.bfloat16:
        if FMT == 1:  # E4M3 by the hardware conversion (exact; the interpreter runs the fp32 path)
            return (sc.to(tl.float8e4nv, bitcast=True).to(tl.float32) * SHMUL).to(DT)
        return (tl.minimum(sc.to(tl.int32) + SH, 255) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return _fold(sc.to(tl.int32), FMT, SH, SHMUL).to(DT)


@triton.jit
def _kperm(w, R: tl.constexpr, KB: tl.constexpr):
    """[R, KB] tile from byte order j = 4C t + 4 c + 2 h + p to dot order kappa = 16 c + 8 h + 2 t + p (C = KB / 16):
    wgmma's A operand gives a thread the kappa with one t (quad lane), i.e. 4C consecutive bytes."""
    C: tl.constexpr = KB // 16
    return tl.reshape(tl.permute(tl.reshape(w, (R, 4, C, 2, 2)), (0, 2, 3, 1, 4)), (R, KB))


@triton.jit
def _xperm(x_ptr, s_ptr, rows_m, mm, stride_xm, k0, k_hi, HAS_S: tl.constexpr, PACKED: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DT: tl.constexpr, EVEN: tl.constexpr):
    """x [BLOCK_M, BLOCK_K] at k0 (contiguous, vector loads), times s, as the dot's right operand(s) in the weight
    tile's permuted k order: packed -> (even k, odd k) [KB, BLOCK_M] each; 8-bit -> one [BLOCK_K, BLOCK_M]."""
    kk = k0 + tl.arange(0, BLOCK_K)
    mk = (kk < k_hi) | EVEN
    xt = tl.load(x_ptr + rows_m[:, None] * stride_xm + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
    if HAS_S:
        if EVEN:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk)[None, :]
        else:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk, mask=mk, other=0.0)[None, :]
    xt = xt.to(DT)
    if PACKED:
        xe, xo = tl.split(tl.reshape(xt, (BLOCK_M, BLOCK_K // 2, 2)))
        return tl.trans(_kperm(xe, BLOCK_M, BLOCK_K // 2)), tl.trans(_kperm(xo, BLOCK_M, BLOCK_K // 2))
    else:
        return tl.trans(_kperm(xt, BLOCK_M, BLOCK_K))


@triton.jit
def _qdotp_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, K_PER_SPLIT,
                  stride_xm, stride_wn, stride_sn,
                  FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                  SPLIT: tl.constexpr, SEM: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                  EVEN: tl.constexpr, SH: tl.constexpr, SHMUL: tl.constexpr, OMUL: tl.constexpr):
    """acc[BLOCK_N, BLOCK_M] += dot(W tile (decoded, K-permuted), x^T (same permutation)); see above."""
    PACKED: tl.constexpr = FMT <= 1
    G: tl.constexpr = BLOCK_K // QBLOCK
    H: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK  # code bytes per scale block
    KB: tl.constexpr = G * H  # code bytes per row of a tile
    pid_n, pid_k, pid_m, offs_n, mn, rows_n, offs_m, mm, rows_m, k_lo, k_hi, g_hi = _dot_tile(
        M, N, K, K_PER_SPLIT, QBLOCK, BLOCK_M, BLOCK_N)
    offs_g = tl.arange(0, G)
    offs_kb = tl.arange(0, KB)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        k0 = tl.multiple_of(k, BLOCK_K)  # splits start at tile multiples
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        sc_ptrs = sc_ptr + rows_n[:, None] * stride_sn + g[None, :]
        # the tile's code bytes, loaded as [BLOCK_N, KB] and then viewed per block; their start is a multiple of
        # BLOCK_K / 2 (>= 16) bytes, which the compiler does not infer through k0 // QBLOCK (NVFP4 got 8-byte loads)
        kb = tl.multiple_of(k0 // QBLOCK * H, 16) + offs_kb
        w_ptrs = w_ptr + rows_n[:, None] * stride_wn + kb[None, :]
        if EVEN:  # N and K multiples of the tile: no masks (fewer predicate instructions per load)
            sc = tl.load(sc_ptrs)
            byte = tl.load(w_ptrs)
        else:
            sc = tl.load(sc_ptrs, mask=mn[:, None] & mg[None, :], other=0)
            byte = tl.load(w_ptrs, mask=mn[:, None] & (kb < g_hi * H)[None, :], other=0)
        byte = tl.reshape(byte, (BLOCK_N, G, H))
        f = _fold16(sc, FMT, SH, SHMUL, DOT_DT)[:, :, None]
        if PACKED:
            if ASM:  # bf16 x bf16 multiplies: HMUL2, two weights each
                lo, hi = _dec_asm(byte, FMT)
            else:
                lo, hi = _dec_ref(byte, FMT)
                lo, hi = _wide(lo), _wide(hi)
            lo = _kperm(tl.reshape(lo * f, (BLOCK_N, KB)), BLOCK_N, KB)
            hi = _kperm(tl.reshape(hi * f, (BLOCK_N, KB)), BLOCK_N, KB)
            xe, xo = _xperm(x_ptr, s_ptr, rows_m, mm, stride_xm, k0, k_hi, HAS_S, True, BLOCK_M, BLOCK_K, DOT_DT, EVEN)
            acc = tl.dot(lo, xe, acc, input_precision=DOT_PREC)
            acc = tl.dot(hi, xo, acc, input_precision=DOT_PREC)
        else:
            w = _dec_asm(byte, FMT) if ASM else _wide(_dec_ref(byte, FMT))
            w = _kperm(tl.reshape(w * f, (BLOCK_N, KB)), BLOCK_N, KB)
            xt = _xperm(x_ptr, s_ptr, rows_m, mm, stride_xm, k0, k_hi, HAS_S, False, BLOCK_M, BLOCK_K, DOT_DT,
                       EVEN)
            acc = tl.dot(w, xt, acc, input_precision=DOT_PREC)
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_n, pid_k, pid_m,
                  FMT, HAS_BIAS, SPLIT, SEM, OMUL)


# --- launch ----------------------------------------------------------------------------------------------------

KERNELS = ("dot", "gemv32", "dotp", "gemvh")  # config KERNEL: tl.dot (any M) | CUDA-core GEMV from int32 code
# words (M = 1) | tl.dot on bf16-decoded, K-permuted weight tiles (any M; see "dotp" above) | the fp16x2 GEMV
# (any M, 1 or 2 rows per program; gemvh.py)


CONFIG_KEYS = {"KERNEL", "BLOCK_N", "BLOCK_K", "BLOCK_M", "SPLIT_K", "SEM", "num_warps", "num_stages", "FP8_CVT",
               "TWO_MUL", "PREFETCH"}


def _auto_split(progs: int, K: int, bk: int, sms: int, per_sm: int, min_iters: int, ceil: bool = False,
                min_per_sm: int = 0) -> int:
    """Largest power-of-two K split keeping <= per_sm programs per SM and >= min_iters K tiles each (ceil: counting
    a split's last, partial tile, as the launch rounds a split up to whole tiles); while fewer than min_per_sm
    programs per SM run, splits may go down to one tile."""
    split = 1
    while split < 64 and progs * split * 2 <= per_sm * sms:
        tiles = triton.cdiv(triton.cdiv(K, split * 2), bk) if ceil else K // (split * 2) // bk
        if tiles < (1 if progs * split < min_per_sm * sms else min_iters):
            break
        split *= 2
    return split


def _split(kern: str, fmt: str, M: int, N: int, K: int, bn: int, bk: int, sms: int, rows: int | None = None,
           prefetch: bool = False) -> int:
    """The K split of a launch, one rule per kernel (the defaults' and any config without SPLIT_K; see
    default_config). rows: x rows per program (BLOCK_M; default gemvh min(2, M), dot / dotp _bm(M)); prefetch:
    gemvh's PREFETCH (fewer, longer programs)."""
    if kern in ("dot", "dotp"):
        progs = triton.cdiv(N, bn) * triton.cdiv(M, rows or _bm(M))
        return _auto_split(progs, K, bk, sms, 6 if kern == "dotp" and fmt == "nvfp4" else 4, 4)
    if kern == "gemv32":
        return _auto_split(triton.cdiv(N, bn), K, bk, sms, 16, 1)
    if (rows or min(2, M)) == 1:
        per_sm = 4 if prefetch else _GEMVH_M1[fmt][3]
        return _auto_split(triton.cdiv(N, bn), K, bk, sms, per_sm, 2, ceil=True, min_per_sm=2)
    return _auto_split(triton.cdiv(N, bn), K, bk, sms, 4 if prefetch else 8 if FMT_IDS[fmt] <= 1 else 7, 1)


# gemvh at M = 1 per format (see default_config): (BLOCK_N, BLOCK_K, num_warps, programs per SM, PREFETCH)
_GEMVH_M1 = {"mxfp4": (64, 512, 4, 11, 0), "nvfp4": (32, 512, 4, 4, 1),
             "mxfp8_e4m3": (16, 512, 2, 8, 0), "mxfp8_e5m2": (16, 512, 2, 8, 0)}


# gemvh at M = 2 per format: (BLOCK_N, BLOCK_K, num_warps); one-warp programs for NVFP4 and MXFP8 (see default_config)
_GEMVH_M2 = {"mxfp4": (32, 512, 4), "nvfp4": (16, 512, 1), "mxfp8_e4m3": (32, 256, 1), "mxfp8_e5m2": (32, 256, 1)}


# dotp (M >= 3; M >= 2 for fp32 activations) per format: (up to M rows, (BLOCK_N, BLOCK_K, num_stages)[, from K])
# on 4 warps, the first entry whose bounds cover M (and K); see default_config
_ANY_M = 1 << 62
_DOTP = {"mxfp4": ((16, (64, 256, 3)), (32, (128, 256, 2), 8192), (32, (64, 256, 3)), (64, (128, 64, 4)),
                   (_ANY_M, (64, 128, 4))),
         "nvfp4": ((32, (64, 128, 4)), (64, (64, 256, 2)), (_ANY_M, (64, 128, 4))),
         "mxfp8_e4m3": ((32, (64, 128, 3)), (_ANY_M, (64, 64, 4))),
         "mxfp8_e5m2": ((32, (64, 128, 3)), (_ANY_M, (64, 64, 4)))}


def default_config(M: int, N: int, K: int, fmt: str, sms: int = 132, fp32_act: bool = False) -> dict:
    """The heuristic launch config (no timing at run time: decode steps stay capturable in CUDA graphs); a call
    without a config takes the GPU's tuned table entry first (`tuned.py`). Every choice below won a same-run H200
    comparison against its alternatives and the bf16 linear; the sweeps, commands and times are in
    docs/tuning/quant_linear.md.
      M = 1, bf16 / fp16 activations: "gemvh" (fp16x2 FMAs; gemv32 took ~1.5x its time). 4-bit [64 x 512] on 4
      warps; NVFP4 [32 x 512] with PREFETCH (its E4M3 scale per 16 codes is hidden by a longer K loop with the next
      tile in registers; MXFP4 gained nothing from it, MXFP8 lost); MXFP8 [16 x 512] on 2 warps. K split: each
      split >= 2 K tiles (counting a partial one; one-tile splits ran 12-15 % slower on 4096x8192 and 6144x4096)
      unless fewer than 2 programs per SM would run (4096x4096, where they won), up to ~11 programs per SM for
      MXFP4, 4 for NVFP4, 8 for MXFP8.
      M = 2: gemvh with both rows in one program (two 2-row programs would decode every tile twice; 4 rows per
      program needed 168-255 registers and lost to dotp); one-warp programs for NVFP4 and MXFP8.
      M = 1, fp32 activations: "gemv32" (fp32 arithmetic), ~16 programs per SM.
      M >= 3 (M >= 2 for fp32 activations): "dotp" (tensor cores on bf16-decoded tiles), tiles from `_DOTP`, 4 warps,
      up to 4 programs per SM (6 for NVFP4: its big-N model shapes ran 4-14 % faster with the second split). The
      tiles are each format's best over a grid at M = 4, 16, 32 (and 64 for 4-bit without a dense copy) on
      4096x14336 and 14336x4096, except NVFP4 to 32 rows: its grid winner, [128 x 256], lost 13 % end to end on
      `nemotron_h_8b`, so [64 x 128] stays; and MXFP4 at 17-32 rows below K = 8192, where [64 x 256] (3 stages)
      beat the grid's [128 x 256] on 11 of the two presets' 12 such shapes, by 7-35 %, and lost on the bench's
      14336x4096."""
    packed = FMT_IDS[fmt] <= 1
    if M == 1 and not fp32_act:
        bn, bk, nw, _, prefetch = _GEMVH_M1[fmt]
        cfg = dict(KERNEL="gemvh", BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=1,
                   SPLIT_K=_split("gemvh", fmt, M, N, K, bn, bk, sms, 1, bool(prefetch)), SEM=True, num_warps=nw,
                   num_stages=2)
        return dict(cfg, PREFETCH=1) if prefetch else cfg
    if M == 2 and not fp32_act:
        bn, bk, nw = _GEMVH_M2[fmt]
        return dict(KERNEL="gemvh", BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=2,
                    SPLIT_K=_split("gemvh", fmt, M, N, K, bn, bk, sms, 2), SEM=True, num_warps=nw, num_stages=2)
    if M == 1:
        bn, bk = (16, 512) if packed else (32, 128)
        return dict(KERNEL="gemv32", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("gemv32", fmt, M, N, K, bn, bk, sms),
                    SEM=True, num_warps=4, num_stages=2)
    bn, bk, st = next(e[1] for e in _DOTP[fmt] if M <= e[0] and K >= (e[2] if len(e) > 2 else 0))
    return dict(KERNEL="dotp", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("dotp", fmt, M, N, K, bn, bk, sms), SEM=True,
                num_warps=4, num_stages=st)


def _dot_config(M: int, N: int, K: int, fmt: str, sms: int) -> dict:
    """Config of the "dot" kernel when a config asks for it (the best of its sweep, docs/tuning/quant_linear.md):
    4-bit [64 x 128] on 4 warps, 4 stages; MXFP8 [128 x 64] with the hardware fp8 conversion (FP8_CVT)."""
    packed = FMT_IDS[fmt] <= 1
    bn, bk = (64, 128) if packed else (128, 64)
    cfg = dict(KERNEL="dot", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("dot", fmt, M, N, K, bn, bk, sms), SEM=True,
               num_warps=4, num_stages=4)
    if not packed:
        cfg["FP8_CVT"] = True
    return cfg


def _bm(M: int) -> int:
    """tl.dot: x rows per tile (the MMA's narrow side; M = 1 padded to 16)."""
    return min(64, max(16, triton.next_power_of_2(M)))


def resolve_config(M: int, N: int, K: int, fmt: str, config: dict | None, sms: int = 132,
                   fp32_act: bool = False) -> dict:
    """The full launch config: `config` over the heuristic of its KERNEL; a missing SPLIT_K is chosen for
    the config's tile (so one sweep entry fits every shape)."""
    config = dict(config or {})
    bad = sorted(set(config) - CONFIG_KEYS)
    if bad:
        raise ValueError(f"config {bad[0]}={config[bad[0]]!r}: not a launch key; expected one of "
                         f"{', '.join(sorted(CONFIG_KEYS))}")
    kern = config.get("KERNEL")
    if kern is not None and kern not in KERNELS:
        raise ValueError(f"config KERNEL={kern!r}: expected one of {', '.join(KERNELS)}")
    if kern is None:
        base = default_config(M, N, K, fmt, sms, fp32_act)
    elif kern in ("gemv32", "gemvh"):
        base = dict(KERNEL=kern, BLOCK_N=32, BLOCK_K=256 if FMT_IDS[fmt] <= 1 else 128, SEM=True, num_warps=4,
                    num_stages=2)
    elif kern == "dot":
        base = _dot_config(M, N, K, fmt, sms)
    else:  # dotp: the M >= 2 default's tile
        base = dict(KERNEL=kern, BLOCK_N=64, BLOCK_K=128 if FMT_IDS[fmt] <= 1 else 64, SEM=True, num_warps=4,
                    num_stages=4)
    cfg = dict(base, **config)
    # a config that changes the tile gets its split chosen here; otherwise the default's own split stands
    if "SPLIT_K" not in config and set(config) & {"KERNEL", "BLOCK_N", "BLOCK_K", "BLOCK_M", "PREFETCH"}:
        cfg["SPLIT_K"] = _split(cfg["KERNEL"], fmt, M, N, K, cfg["BLOCK_N"], cfg["BLOCK_K"], sms, cfg.get("BLOCK_M"),
                                bool(cfg.get("PREFETCH")))
    return cfg


def _code_shift(fmt: str, cvt: bool) -> int:
    """R: the kernels' raw decode gives value * 2^-R."""
    if FMT_IDS[fmt] <= 1:
        return 126
    if cvt:
        return 0
    return 120 if fmt == "mxfp8_e4m3" else 112


_CNT: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor | None:
    """Per-output-tile split-K counters (int32, zero between calls: the last program resets its own).
    Grown outside CUDA-graph capture only; None while capturing with too few (then the host sums)."""
    t = _CNT.get(device)
    if t is None or t.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        t = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _CNT[device] = t
    return t


def quant_linear_triton(x2d: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None,
                        fmt: str, qblock: int, s: torch.Tensor | None, bias: torch.Tensor | None,
                        act_quant: str | None, config: dict | None = None) -> torch.Tensor:
    """x2d [M, K] -> [M, N] in x2d.dtype. act_quant='mxfp4' needs qblock 32 (the caller quantizes
    activations itself for NVFP4 weights)."""
    M, K = x2d.shape
    N = data.shape[0]
    f32 = x2d.dtype == torch.float32
    if config is None:
        config = tuned_config(M, N, K, fmt, x2d.device, f32)
    cfg = resolve_config(M, N, K, fmt, config, _sms(x2d.device), f32)
    kern = cfg["KERNEL"]
    if kern == "gemv32" and M != 1:  # the fp32 CUDA-core GEMV reads one row; more rows take the M >= 2 default
        cfg = resolve_config(M, N, K, fmt, {k: v for k, v in (config or {}).items() if k != "KERNEL"},
                             _sms(x2d.device), f32)
        kern = cfg["KERNEL"]
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    if bk % qblock or bk < 32 or bk & (bk - 1):
        raise ValueError(f"config BLOCK_K={bk}: expected a power of two >= 32, a multiple of the format block {qblock}")
    if act_quant is not None and qblock != 32:
        raise ValueError(f"act_quant={act_quant!r} in-kernel needs 32-blocks of weights, got {qblock}")
    k_per = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per)
    cvt = bool(cfg.get("FP8_CVT", False)) and fmt.startswith("mxfp8")
    if cvt and kern != "dot":
        raise ValueError(f"config FP8_CVT=True: only KERNEL='dot' takes it, got KERNEL={kern!r}")
    if cfg.get("PREFETCH", 0) and kern != "gemvh":
        raise ValueError(f"config PREFETCH={cfg['PREFETCH']!r}: only KERNEL='gemvh' takes it, got KERNEL={kern!r}")
    if kern == "gemvh" and cfg.get("BLOCK_M", 1) not in (1, 2):
        raise ValueError(f"config BLOCK_M={cfg['BLOCK_M']!r}: KERNEL='gemvh' takes 1 or 2 rows per program")
    if kern == "dotp" and ("TWO_MUL" in cfg or "BLOCK_M" in cfg and cfg["BLOCK_M"] < 16):
        raise ValueError("config KERNEL='dotp': no TWO_MUL, BLOCK_M >= 16")
    dummy = data
    common = dict(FMT=FMT_IDS[fmt], QBLOCK=qblock, HAS_S=s is not None, HAS_BIAS=bias is not None,
                  ACT_Q=1 if act_quant == "mxfp4" else 0, BLOCK_N=bn, BLOCK_K=bk, FP8_CVT=cvt,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    sem = split > 1 and bool(cfg.get("SEM", True))
    y = torch.empty(M, N, dtype=x2d.dtype, device=x2d.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x2d.device) if split > 1 else y
    r = _code_shift(fmt, cvt)
    if kern == "dotp":
        if act_quant is not None:  # the permuted x tile has no 32-blocks: quantize x (exactly) beforehand
            from synodic.quant.qtensor import fake_quant
            x2d = fake_quant(x2d.float() if s is None else x2d.float() * s, act_quant).to(x2d.dtype)
            s = None
            common.update(HAS_S=False)
        bm = int(cfg.get("BLOCK_M", _bm(M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        low = x2d.dtype == torch.bfloat16 and not interp  # bf16 operands; else fp32 ones (see "dotp" above)
        _qdotp_kernel[grid](
            x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, DOT_DT=tl.bfloat16 if low else tl.float32, DOT_PREC="tf32" if low else "ieee",
            BLOCK_M=bm, ASM=low, EVEN=N % bn == 0 and K % bk == 0, SH=r - _DSH, SHMUL=float(2.0 ** (r - _DSH)),
            OMUL=float(2.0 ** _DSH),
            **{k: v for k, v in common.items() if k not in ("FP8_CVT", "ACT_Q")})
    elif kern == "gemvh":
        bm = int(cfg.get("BLOCK_M", min(2, M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        words = code_words(data)
        # the split's K range in words too: its divisibility gives 16-byte loads
        _qgemvh_kernel[grid](
            x2d, words, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, k_per // (8 if FMT_IDS[fmt] <= 1 else 4),
            x2d.stride(0), words.stride(0), scale.stride(0), SPLIT=split, SEM=sem, BLOCK_M=bm, ASM=not interp,
            EVEN=N % bn == 0 and K % bk == 0 and M % bm == 0, OMUL=gemvh_omul(FMT_IDS[fmt]),
            PREFETCH=1 if cfg.get("PREFETCH", 0) else 0, **{k: v for k, v in common.items() if k != "FP8_CVT"})
    elif kern == "gemv32":
        cnt = _counters(x2d.device, triton.cdiv(N, bn)) if sem else None
        sem = cnt is not None
        words = code_words(data)
        _qgemv32_kernel[(triton.cdiv(N, bn), split)](
            x2d, words, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, N, K, k_per, words.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, XMUL=float(2.0 ** (r - _DSH)), OMUL=float(2.0 ** _DSH),
            **{k: v for k, v in common.items() if k != "FP8_CVT"})
    else:
        bm = int(cfg.get("BLOCK_M", _bm(M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        # operands: bf16 / fp16 activations -> that dtype (decoded codes times scales are exact in it), fp32 ->
        # IEEE fp32; the interpreter's bf16/fp16 tl.dot is wrong (Triton 3.9): fp32 there, exact for these
        low = x2d.dtype in (torch.bfloat16, torch.float16) and not interp
        dot_dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[x2d.dtype] if low else tl.float32
        # fp16 cannot hold value * 2^-64: exact two-multiply decode there (and when the config asks)
        two = bool(cfg.get("TWO_MUL", False)) or dot_dt == tl.float16
        dsh = 0 if (two or r == 0) else _DSH
        _qdot_kernel[grid](
            x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, DOT_DT=dot_dt, DOT_PREC="tf32" if low else "ieee", BLOCK_M=bm, TWO_MUL=two,
            RMUL=float(2.0 ** r), SH=r - dsh, SHMUL=float(2.0 ** (r - dsh)), OMUL=float(2.0 ** dsh), **common)
    if split > 1 and not sem:
        return part.sum(0).to(x2d.dtype)
    return y


def code_words(data: torch.Tensor) -> torch.Tensor:
    """Contiguous code bytes [N, B] (B % 4 == 0) as int32 words [N, B/4], little-endian (byte j of a word at
    bits 8j): a view, or a copy when the storage offset is not 4-byte aligned."""
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % 4 or not data.is_contiguous():
        raise ValueError(f"code words: expected contiguous uint8 [N, B] with B % 4 == 0, got {data.dtype} "
                         f"{tuple(data.shape)}")
    if data.storage_offset() % 4:
        data = data.clone()
    return data.view(torch.int32)


_SMS: dict = {}
_NAMES: dict = {}


def tuned_config(M: int, N: int, K: int, fmt: str, device: torch.device, fp32_act: bool = False) -> dict | None:
    """The device's tuned table entry for a call without a config (CUDA, bf16 / fp16 activations), or None: the
    heuristic (`default_config`) then decides."""
    if fp32_act or device.type != "cuda":
        return None
    return tuned.lookup(_device_name(device), fmt, N, K, M)


def _device_name(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NAMES:
        _NAMES[idx] = torch.cuda.get_device_name(idx)
    return _NAMES[idx]


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]
