"""quant_linear's "gemv32" kernel: the one-row GEMV over int32 code words (fp32 activations; see the note below)."""
from __future__ import annotations

import triton
import triton.language as tl

from .codec import _SIGN2, _gemv_tile, _mxfp4_fake, _scale, _shl, _store_out

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
    E: tl.constexpr = 8 if FMT <= 1 else 4  # codes per word
    G: tl.constexpr = BLOCK_K // QBLOCK
    WPB: tl.constexpr = QBLOCK // E
    # one row (2-D grid): the M part of the tile is unused
    pid_n, pid_k, _, offs_n, mn, rows, _, _, offs_g, offs_w, offs_q, k_lo, k_hi, g_hi = _gemv_tile(
        x_ptr, 0, N, K, K_PER_SPLIT, QBLOCK, 1, BLOCK_N, G, BLOCK_K // E)
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
