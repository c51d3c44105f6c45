"""gemvh: the GEMV for one or two activation rows with packed fp16 arithmetic (HFMA2: two multiply-adds per
instruction).

Why: "gemv32" spends ~5.8 SASS instructions per weight on the H200 (offline sm_90 count: the decode to fp32,
the bf16-pair unpacking, one FFMA per weight), about half of its 21 us at 4096 x 14336; the bytes alone take
~10 us. Here two weights share one 32-bit register as fp16 halves and one `fma.rn.f16x2` multiplies both by
their two activations: ~3.5 instructions per weight in the K loop for 4-bit formats (decode ~1.9, the FMA 0.5,
the rest activation pairing, block scales and loads), ~2.7 for MXFP8. The MXFP4 kernel runs at ~0.76 of a
load-only probe of its own tile: the decode is no longer the whole story, nor fully hidden (times:
docs/tuning/quant_linear.md).

Weights (the QTensor layout, no repacking) as int32 code words like gemv32: E = 8 nibbles / 4 bytes per word.
  * E2M1 (MXFP4, NVFP4): code J and code J + 4 of a word sit 16 bits apart; two shifts and two masks put their
    magnitude bits at fp16 bits 9..11 and their sign at 15, in the word's two halves (`_e2m1_pair`). The fp16
    value is then exactly E2M1 * 2^-14 (exponent field e1 e0, mantissa bit m; e = 0 lands on the fp16
    subnormal 2^-15 = 0.5 * 2^-14), and the 2^14 goes back on the output once. (A multiply cannot stand in
    for the two shifts as in "dotp"'s bf16 decode: sign and magnitude are 3 bits apart in the nibble and must
    be 4 apart in fp16, so the two shifted copies overlap and the carry flips the sign of code 0xF.)
  * E4M3 / E5M2: `cvt.rn.f16x2.e4m3x2` / `.e5m2x2` (sm_89+), two bytes per instruction; every fp8 value is exact
    in fp16 (NaN / Inf codes stay NaN / Inf).
Activations: x times s (and the in-kernel MXFP4 quantizer, as gemv32), then per 32-block (the weight block) times
a power of two 2^c chosen from the block's absolute max so that fp16 holds them and no fp16 partial sum can
overflow: 4-bit |x 2^c| in [2^14, 2^15) (products <= 12), E4M3 [1, 2) (<= 896), E5M2 [2^-7, 2^-6); a block's
16 products per fp16 half then sum to < 28672. The block scale times 2^-c multiplies the block's fp32 sum.
Per (row, block) one inline-asm chain: mul / fma.rn.f16x2 over the block's register pairs into one fp16x2
accumulator, its two halves added, to fp32; each (row, block position) sums its K tiles in an fp32 register, and
the tile's block positions are added once after the K loop (a sum per K tile cost ~70 shuffles and adds per
thread per tile: NVFP4 / MXFP8 4-7 % faster on the H200 without it). Two activation rows share a
decoded weight tile (BLOCK_M = 2); four per program needed 168-255 registers and lost to tl.dot on the H200.

Precision: products and a block's fp16 partial sums (16 terms per half) are rounded to fp16 (11-bit
significands): rel. RMSE ~1.5e-3 against the fp32 reference on the bench's weights, the order of a bf16
output's own rounding (2^-9) and far below the formats' quantization error, so this is the default for bf16 /
fp16 activations; fp32 activations keep gemv32 (fp32 arithmetic). Activations below 2^-24 of their block's max
flush to zero in fp16.
On the interpreter (no inline asm) the same fp16 operands are multiplied and summed in fp32 (`ASM=False`):
it checks the decode, the pairing and the scaling, not the fp16 rounding, which the GPU tests bound.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .codec import _SIGN2, _e4m3, _e5m2, _gemv_tile, _mxfp4_fake, _scale, _shl, _store_out
from .dot import _scale_bias

_MAG2 = tl.constexpr(0x0E000E00)  # fp16 bits 9..11 of both halves: an E2M1 magnitude (e1 e0 m)
_F16_E2M1 = 14  # the fp16 halves hold E2M1 * 2^-14


@triton.jit
def _e2m1_pair(w, J: tl.constexpr):
    """int32 words of 8 E2M1 codes (code i at bits 4i) -> int32 of two fp16 halves: code J (low half) and
    code J + 4 (high half), each E2M1 * 2^-14 exactly."""
    return (_shl(w, 9 - 4 * J) & _MAG2) | (_shl(w, 12 - 4 * J) & _SIGN2)


@triton.jit
def _f16_lo(v):
    """int32 of two fp16 halves -> the low one as fp32 (exact)."""
    return (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f16_hi(v):
    return (v >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _hpair_ref(h, x):
    """One fp16 register pair's two products, in fp32 (the interpreter's stand-in for an fp16x2 FMA)."""
    return _f16_lo(h) * _f16_lo(x) + _f16_hi(h) * _f16_hi(x)


def _fma_chain_asm(n: int, cvt: str | None) -> str:
    """PTX: the fp16x2 dot of n register pairs, summed into one fp16x2 accumulator, its halves added, to fp32.
    Operands: $0 the fp32 result; then the n weight registers (two fp16 halves each), or with cvt the n / 2
    fp8 words (two bytes per pair, `cvt.rn.f16x2.<cvt>`); then the n activation registers."""
    nw = n if cvt is None else n // 2
    lines = [".reg .b32 a, w<%d>;" % n, ".reg .b16 l, h, b<%d>;" % n]
    if cvt is None:
        lines += [f"mov.b32 w{i}, ${1 + i};" for i in range(n)]
    else:
        for i in range(nw):
            lines += [f"mov.b32 {{b{2 * i}, b{2 * i + 1}}}, ${1 + i};",
                      f"cvt.rn.f16x2.{cvt} w{2 * i}, b{2 * i};", f"cvt.rn.f16x2.{cvt} w{2 * i + 1}, b{2 * i + 1};"]
    lines.append(f"mul.rn.f16x2 a, w0, ${1 + nw};")
    lines += [f"fma.rn.f16x2 a, w{i}, ${1 + nw + i}, a;" for i in range(1, n)]
    lines += ["mov.b32 {l, h}, a;", "add.rn.f16 l, l, h;", "cvt.f32.f16 $0, l;"]
    return "{\n" + "\n".join(lines) + "\n}"


_ASM_E2M1_32 = tl.constexpr(_fma_chain_asm(16, None))  # an MXFP4 block: 4 words x 4 pairs
_ASM_E2M1_16 = tl.constexpr(_fma_chain_asm(8, None))  # an NVFP4 block: 2 words x 4 pairs
_ASM_E4M3_32 = tl.constexpr(_fma_chain_asm(16, "e4m3x2"))  # an MXFP8 block: 8 words x 2 pairs
_ASM_E5M2_32 = tl.constexpr(_fma_chain_asm(16, "e5m2x2"))


@triton.jit
def _split4(t):
    """The last dim (4) of t as four tensors, in order."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _fp8_ref(c, FMT: tl.constexpr):
    if FMT == 2:
        return _e4m3(c & 0xFF)
    else:
        return _e5m2(c & 0xFF)


@triton.jit
def _word8_ref(w, x0, x1, FMT: tl.constexpr):
    """sum over a word's 4 fp8 codes of code * x: bytes (0, 1) meet register x0, bytes (2, 3) x1."""
    return (_fp8_ref(w, FMT) * _f16_lo(x0) + _fp8_ref(w >> 8, FMT) * _f16_hi(x0)
            + _fp8_ref(w >> 16, FMT) * _f16_lo(x1) + _fp8_ref(w >> 24, FMT) * _f16_hi(x1))


@triton.jit
def _e2m1_word(w):
    """A word's 4 fp16 weight pairs (`_e2m1_pair` J = 0..3)."""
    return _e2m1_pair(w, 0), _e2m1_pair(w, 1), _e2m1_pair(w, 2), _e2m1_pair(w, 3)


@triton.jit
def _block_dot(w, xp, FMT: tl.constexpr, WPB: tl.constexpr, ASM: tl.constexpr):
    """Per (row, block): sum over the block's codes of weight * x, fp32 [BLOCK_N, G]. w: int32 code words
    [BLOCK_N, G, WPB]; xp: activation registers [G, WPB, P] (P = 4 per E2M1 word, 2 per fp8 word; register p of
    word j meets the word's pair p). On the GPU one inline-asm fp16x2 chain per (row, block)."""
    if FMT <= 1:
        x0, x1, x2, x3 = _split4(xp)  # by pair: [G, WPB] each
        if WPB == 4:
            wa, wb, wc, wd = _split4(w)
            a0, b0, c0, d0 = _split4(x0)
            a1, b1, c1, d1 = _split4(x1)
            a2, b2, c2, d2 = _split4(x2)
            a3, b3, c3, d3 = _split4(x3)
            if ASM:
                ha0, ha1, ha2, ha3 = _e2m1_word(wa)
                hb0, hb1, hb2, hb3 = _e2m1_word(wb)
                hc0, hc1, hc2, hc3 = _e2m1_word(wc)
                hd0, hd1, hd2, hd3 = _e2m1_word(wd)
                return tl.inline_asm_elementwise(
                    asm=_ASM_E2M1_32, constraints="=r" + ",r" * 32,
                    args=[ha0, ha1, ha2, ha3, hb0, hb1, hb2, hb3, hc0, hc1, hc2, hc3, hd0, hd1, hd2, hd3,
                          a0[None, :], a1[None, :], a2[None, :], a3[None, :],
                          b0[None, :], b1[None, :], b2[None, :], b3[None, :],
                          c0[None, :], c1[None, :], c2[None, :], c3[None, :],
                          d0[None, :], d1[None, :], d2[None, :], d3[None, :]],
                    dtype=tl.float32, is_pure=True, pack=1)
            return (_word4_ref(wa, a0, a1, a2, a3) + _word4_ref(wb, b0, b1, b2, b3)
                    + _word4_ref(wc, c0, c1, c2, c3) + _word4_ref(wd, d0, d1, d2, d3))
        else:  # NVFP4: 2 words per 16-block
            wa, wb = tl.split(w)
            a0, b0 = tl.split(x0)
            a1, b1 = tl.split(x1)
            a2, b2 = tl.split(x2)
            a3, b3 = tl.split(x3)
            if ASM:
                ha0, ha1, ha2, ha3 = _e2m1_word(wa)
                hb0, hb1, hb2, hb3 = _e2m1_word(wb)
                return tl.inline_asm_elementwise(
                    asm=_ASM_E2M1_16, constraints="=r" + ",r" * 16,
                    args=[ha0, ha1, ha2, ha3, hb0, hb1, hb2, hb3,
                          a0[None, :], a1[None, :], a2[None, :], a3[None, :],
                          b0[None, :], b1[None, :], b2[None, :], b3[None, :]],
                    dtype=tl.float32, is_pure=True, pack=1)
            return _word4_ref(wa, a0, a1, a2, a3) + _word4_ref(wb, b0, b1, b2, b3)
    else:  # fp8: 8 words per 32-block, two registers each
        x0, x1 = tl.split(xp)  # [G, 8] each
        wlo, whi = tl.split(tl.reshape(w, w.shape[:-1] + [4, 2]))  # word j = 2 q + i: whi i = 1
        wa, wb, wc, wd = _split4(wlo)
        we, wf, wg, wh = _split4(whi)
        xlo0, xhi0 = tl.split(tl.reshape(x0, x0.shape[:-1] + [4, 2]))
        xlo1, xhi1 = tl.split(tl.reshape(x1, x1.shape[:-1] + [4, 2]))
        a0, b0, c0, d0 = _split4(xlo0)
        e0, f0, g0, h0 = _split4(xhi0)
        a1, b1, c1, d1 = _split4(xlo1)
        e1, f1, g1, h1 = _split4(xhi1)
        if ASM:
            args = [wa, wb, wc, wd, we, wf, wg, wh,
                    a0[None, :], a1[None, :], b0[None, :], b1[None, :], c0[None, :], c1[None, :],
                    d0[None, :], d1[None, :], e0[None, :], e1[None, :], f0[None, :], f1[None, :],
                    g0[None, :], g1[None, :], h0[None, :], h1[None, :]]
            if FMT == 2:
                return tl.inline_asm_elementwise(asm=_ASM_E4M3_32, constraints="=r" + ",r" * 24, args=args,
                                                 dtype=tl.float32, is_pure=True, pack=1)
            return tl.inline_asm_elementwise(asm=_ASM_E5M2_32, constraints="=r" + ",r" * 24, args=args,
                                             dtype=tl.float32, is_pure=True, pack=1)
        return (_word8_ref(wa, a0, a1, FMT) + _word8_ref(wb, b0, b1, FMT) + _word8_ref(wc, c0, c1, FMT)
                + _word8_ref(wd, d0, d1, FMT) + _word8_ref(we, e0, e1, FMT) + _word8_ref(wf, f0, f1, FMT)
                + _word8_ref(wg, g0, g1, FMT) + _word8_ref(wh, h0, h1, FMT))


@triton.jit
def _word4_ref(w, x0, x1, x2, x3):
    """sum over a word's 8 E2M1 codes of (code * 2^-14) * x: pair J (codes J, J + 4) meets register xJ."""
    return (_hpair_ref(_e2m1_pair(w, 0), x0[None, :]) + _hpair_ref(_e2m1_pair(w, 1), x1[None, :])
            + _hpair_ref(_e2m1_pair(w, 2), x2[None, :]) + _hpair_ref(_e2m1_pair(w, 3), x3[None, :]))


@triton.jit
def _block_range(amax, FMT: tl.constexpr):
    """Per-block powers of two (xmul, xinv = 1 / xmul) that put the block's absolute max amax at
    [2^14, 2^15) (E2M1), [1, 2) (E4M3), [2^-7, 2^-6) (E5M2); exponent clamped so both stay normal fp32
    (zero, subnormal and NaN / Inf maxima included)."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    if FMT <= 1:  # target exponent T = 14: fields 254 + T - e and e - T
        e = tl.minimum(tl.maximum(e, 15), 254)
        return ((268 - e) << 23).to(tl.float32, bitcast=True), ((e - 14) << 23).to(tl.float32, bitcast=True)
    elif FMT == 2:  # T = 0
        e = tl.minimum(tl.maximum(e, 1), 253)
        return ((254 - e) << 23).to(tl.float32, bitcast=True), (e << 23).to(tl.float32, bitcast=True)
    else:  # T = -7
        e = tl.minimum(tl.maximum(e, 1), 246)
        return ((247 - e) << 23).to(tl.float32, bitcast=True), ((e + 7) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _f16_bits(v):
    """fp32 -> fp16 (round to nearest even), its 16 bits in the low half of an int32."""
    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _row_part(x_row, s_ptr, w, sc, col, mg, mi, M, FMT: tl.constexpr, QBLOCK: tl.constexpr, G: tl.constexpr,
              HAS_S: tl.constexpr, ACT_Q: tl.constexpr, ASM: tl.constexpr, EVEN: tl.constexpr):
    """One activation row's contribution to the tile's outputs over one K tile, fp32 [BLOCK_N]: x [G, QBLOCK]
    loaded, times s, (MXFP4-quantized), scaled per block into fp16 range, paired, dotted (`_block_dot`), times the
    block scales."""
    WPB: tl.constexpr = QBLOCK // (8 if FMT <= 1 else 4)
    if EVEN:  # every row of the program exists too
        xv = tl.load(x_row + col).to(tl.float32)
        if HAS_S:
            xv = xv * tl.load(s_ptr + col)
    else:
        xm = mg[:, None] & ((tl.zeros((G, QBLOCK), tl.int32) + mi) < M)  # row mi of x exists
        xv = tl.load(x_row + col, mask=xm, other=0.0).to(tl.float32)
        if HAS_S:
            xv = xv * tl.load(s_ptr + col, mask=xm, other=0.0)
    if ACT_Q == 1:
        xv = _mxfp4_fake(xv, 1)
    xmul, xinv = _block_range(tl.max(tl.abs(xv), axis=1), FMT)
    xb = _f16_bits(xv * xmul[:, None])
    if FMT <= 1:  # k = 8 word + 4 h + J: register J of a word holds x[J] (low half) and x[J + 4] (high half)
        lo, hi = tl.split(tl.permute(tl.reshape(xb, (G, WPB, 2, 4)), (0, 1, 3, 2)))
    else:  # k = 4 word + 2 i + t: register i holds x[2 i] (low half) and x[2 i + 1] (high half)
        lo, hi = tl.split(tl.reshape(xb, (G, WPB, 2, 2)))
    return _block_dot(w, lo | (hi << 16), FMT, WPB, ASM) * (sc * xinv[None, :])


@triton.jit
def _load_tile(w_ptr, sc_ptr, rows, mn, offs_g, offs_w, k0, k_lo, k_hi, g_hi, pid_k, KW_PER_SPLIT, stride_wn, stride_sn,
               FMT: tl.constexpr, QBLOCK: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr, ASM: tl.constexpr):
    """The K tile at k0: int32 code words [BLOCK_N, BLOCK_K / E] and the block scales as fp32 [BLOCK_N, G]."""
    E: tl.constexpr = 8 if FMT <= 1 else 4  # codes per word
    g = k0 // QBLOCK + offs_g
    sc_ptrs = sc_ptr + rows[:, None] * stride_sn + g[None, :]
    cw = tl.multiple_of(pid_k * KW_PER_SPLIT + (k0 - k_lo) // E, BLOCK_K // E) + offs_w  # 16-byte loads
    w_ptrs = w_ptr + rows[:, None] * stride_wn + cw[None, :]
    # the codes are read once per call: evict_first keeps them from displacing what stays in L2 (MXFP8 ~11 %,
    # 4-bit 1-5 % faster; docs/tuning/quant_linear.md)
    if EVEN:  # N and K multiples of the tile: no masks
        sc = tl.load(sc_ptrs)
        w = tl.load(w_ptrs, eviction_policy="evict_first")
    else:
        sc = tl.load(sc_ptrs, mask=mn[:, None] & (g < g_hi)[None, :], other=0)
        w = tl.load(w_ptrs, mask=mn[:, None] & (cw < k_hi // E)[None, :], other=0, eviction_policy="evict_first")
    if FMT == 1 and ASM:  # NVFP4's E4M3 scales by the hardware conversion (exact; NaN code kept)
        sc = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        sc = _scale(sc.to(tl.int32), FMT)
    return w, sc


@triton.jit
def _qgemvh_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, K_PER_SPLIT,
                   KW_PER_SPLIT, stride_xm, stride_wn, stride_sn,
                   FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACT_Q: tl.constexpr, SPLIT: tl.constexpr, SEM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr, EVEN: tl.constexpr,
                   OMUL: tl.constexpr, PREFETCH: tl.constexpr = 0):
    """y[m, n] = sum_k act(x[m, k] s[k]) w[n, k] for BLOCK_M (1 or 2) rows of x (the program's rows m < M),
    from int32 code words (w_ptr: int32, stride_wn in words); a weight tile is decoded once for both rows (see the
    module docstring). PREFETCH=1: the next K tile's codes and scales are loaded before this tile is decoded
    (registers as the pipeline: the kernel-level num_stages pipelines no load that feeds no tl.dot; a loop written as
    tl.range(..., num_stages=S) does, through cp.async and shared memory, but was slower at every tile and split
    timed on the H200)."""
    E: tl.constexpr = 8 if FMT <= 1 else 4  # codes per word
    G: tl.constexpr = BLOCK_K // QBLOCK
    WPB: tl.constexpr = QBLOCK // E
    pid_n, pid_k, pid_m, offs_n, mn, rows, m0, x0, offs_g, offs_w, offs_q, k_lo, k_hi, g_hi = _gemv_tile(
        x_ptr, stride_xm, N, K, K_PER_SPLIT, QBLOCK, BLOCK_M, BLOCK_N, G, BLOCK_K // E)
    acc0 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    if PREFETCH:
        last = k_lo + ((k_hi - k_lo - 1) // BLOCK_K) * BLOCK_K  # the split's last tile start
        w_n, sc_n = _load_tile(w_ptr, sc_ptr, rows, mn, offs_g, offs_w, k_lo, k_lo, k_hi, g_hi, pid_k, KW_PER_SPLIT,
                               stride_wn, stride_sn, FMT, QBLOCK, BLOCK_K, EVEN, ASM)
    for k in range(k_lo, k_hi, BLOCK_K):
        k0 = tl.multiple_of(k, BLOCK_K)  # splits start at tile multiples
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        if PREFETCH:  # the last iteration re-reads its own tile (an L1 / L2 hit): no branch, no extra HBM bytes
            w = w_n
            sc = sc_n
            kn = tl.multiple_of(tl.minimum(k0 + BLOCK_K, last), BLOCK_K)
            w_n, sc_n = _load_tile(w_ptr, sc_ptr, rows, mn, offs_g, offs_w, kn, k_lo, k_hi, g_hi, pid_k,
                                   KW_PER_SPLIT, stride_wn, stride_sn, FMT, QBLOCK, BLOCK_K, EVEN, ASM)
        else:
            w, sc = _load_tile(w_ptr, sc_ptr, rows, mn, offs_g, offs_w, k0, k_lo, k_hi, g_hi, pid_k, KW_PER_SPLIT,
                               stride_wn, stride_sn, FMT, QBLOCK, BLOCK_K, EVEN, ASM)
        w = tl.reshape(w, (BLOCK_N, G, WPB))
        col = (g * QBLOCK)[:, None] + offs_q[None, :]
        acc0 += _row_part(x0, s_ptr, w, sc, col, mg, m0, M, FMT, QBLOCK, G, HAS_S, ACT_Q, ASM, EVEN)
        if BLOCK_M == 2:
            acc1 += _row_part(x0 + stride_xm, s_ptr, w, sc, col, mg, m0 + 1, M, FMT, QBLOCK, G, HAS_S, ACT_Q, ASM,
                              EVEN)
    # per-(row, block) partials are summed over the tile's blocks once, after the K loop (not per K tile)
    if BLOCK_M == 1:
        acc = tl.sum(acc0, axis=1)[:, None]
    else:
        acc = tl.join(tl.sum(acc0, axis=1), tl.sum(acc1, axis=1))
    acc = _scale_bias(acc, p_ptr, b_ptr, offs_n, mn, pid_k, FMT, HAS_BIAS, OMUL)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    off = offs_m.to(tl.int64)[None, :] * N + offs_n[:, None]
    _store_out(acc, y_ptr, part_ptr, cnt_ptr, off, off, mn[:, None] & (offs_m < M)[None, :], pid_k,
               pid_m * tl.num_programs(0) + pid_n, M * N, SPLIT, SEM)


def gemvh_omul(fmt_id: int) -> float:
    """The output multiplier: 2^14 for the E2M1 halves (E2M1 * 2^-14), 1 for fp8."""
    return float(2.0 ** _F16_E2M1) if fmt_id <= 1 else 1.0
