"""quant_linear's "dot" kernel: the decoded weight tile as the left tl.dot operand (any M), and the exact
bit-level decode and scale folding the other kernels share (see the note below)."""
from __future__ import annotations

import triton
import triton.language as tl

from .codec import _decode, _e4m3, _e8m0, _mxfp4_from_amax, _scale, _store_out

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
def _scale_bias(acc, p_ptr, b_ptr, offs_n, mn, pid_k, FMT: tl.constexpr, HAS_BIAS: tl.constexpr, OMUL: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] times the caller's output multiplier OMUL (2^DSH for the dot kernels, `gemvh_omul`
    for gemvh) and NVFP4's tensor scale, + bias (first split only)."""
    acc = acc * OMUL
    if FMT == 1:
        acc = acc * tl.load(p_ptr)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)[:, None]
    return acc


@triton.jit
def _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_k, tile,
                  FMT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, SEM: tl.constexpr,
                  OMUL: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] through `_scale_bias`, stored as y[m, n]; tile: this output tile's split-K counter
    index (unique per (m, n) tile of the caller's grid)."""
    acc = _scale_bias(acc, p_ptr, b_ptr, offs_n, mn, pid_k, FMT, HAS_BIAS, OMUL)
    off = rows_m[None, :] * N + offs_n[:, None]
    _store_out(acc, y_ptr, part_ptr, cnt_ptr, off, off, mn[:, None] & mm[None, :], pid_k, tile, M * N, SPLIT, SEM)


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
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_k,
                  pid_m * tl.num_programs(0) + pid_n, FMT, HAS_BIAS, SPLIT, SEM, OMUL)
