"""quant_linear's "kgemm" kernel: the packed GEMM for 2-256+ rows (W4A16 MXFP4 / NVFP4, W8A16 MXFP8) over the
K-major plane layout of kmajor.py.

Per K group (GROUP = E * B codes: 8 nibbles or 4 bytes per int32 word, B the format's block) a program loads
the group's words [B, BLOCK_N] once (N contiguous: 16-byte vector loads along N; cp.async-pipelined) and E / 2
times builds, with two shifts and two masks on the 32-bit word, two bf16 bit patterns at once (`_pair`: slot j in
the low half, slot j + E/2 in the high one; value * 2^-R, exact, E2M1 code 1 the subnormal 2^-127). Each slot is a
whole scale block with K-contiguous rows, so it is multiplied by its block's factor (scale * 2^(R - 64), one
[BLOCK_N] row of packed bf16 pairs, kmajor.py) and fed as is to tl.dot against the x columns it covers: E dots of
K = B per group, no join, reshape or permute of decoded data anywhere. x * s (the DualQuant / SmoothQuant
input-channel multiplier) is formed in fp32 and rounded to bf16 before the MMA, as the other dot kernels do; the
fp32 accumulator gets 2^64 (and NVFP4's tensor scale) once, plus bias, in the epilogue.

Decode variants (constexpr ASM): 0 = plain Triton, the two halves widened to fp32 by a shift / mask (exact),
one fp32 multiply each, then bf16; 1 = one inline-asm `mul.rn.bf16x2` per two weights straight on the 32-bit
pair (HMUL2) and a free split into two bf16 (sm_90). Orientation (constexpr SWAP): 0 = acc[BLOCK_M, BLOCK_N] =
dot(x, W) (x the MMA's A operand, the decoded weight its B operand through shared memory; the classic mixed-input
GEMM); 1 = acc[BLOCK_N, BLOCK_M] = dot(W^T, x^T) (the weight the wide A side: BLOCK_M = 16 fills the narrow side
for small M). Split K: programs share an output tile's groups; the last to finish sums the fp32 partials in split
order (a per-tile counter; the split count is a run-time value, so one compile serves every split), or, while a
CUDA graph is captured without enough counters, the host sums them.

On the interpreter (no inline asm, and its bf16 dot is unreliable) or for fp16 / fp32 activations, operands are
fp32 and the dot IEEE fp32 (exact up to summation order).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .codec import _shl


@triton.jit
def _pair(w, J: tl.constexpr, FMT: tl.constexpr):
    """int32 words -> int32: bf16 bits of slot J (low 16 bits) and slot J + E/2 (high 16), value * 2^-R
    (R = 126 for E2M1, 120 for E4M3, 112 for E5M2; 8-bit NaN / Inf codes decode finite: the quantizer writes none).
    Magnitude and sign each shifted straight to their bf16 bits: 4 SASS ops (2 shifts, and, and-or) per two weights."""
    if FMT <= 1:  # nibble J at bits 4J, J + 4 at 4J + 16: magnitude -> bits 6..8, sign -> 15 of each half
        return (_shl(w, 6 - 4 * J) & 0x01C001C0) | (_shl(w, 12 - 4 * J) & -2147450880)  # 0x80008000
    elif FMT == 2:  # byte J at 8J, J + 2 at 8J + 16: magnitude -> bits 4..10, sign -> 15
        return (_shl(w, 4 - 8 * J) & 0x07F007F0) | (_shl(w, 8 - 8 * J) & -2147450880)
    else:  # E5M2: magnitude -> bits 5..11
        return (_shl(w, 5 - 8 * J) & 0x0FE00FE0) | (_shl(w, 8 - 8 * J) & -2147450880)


@triton.jit
def _bf16x2_mul(pair, f2):
    """Two bf16 bit patterns in one int32 times two bf16 factors (f2, packed the same way): one HMUL2, then the
    halves as two bf16 tensors (a register split, no instruction)."""
    return tl.inline_asm_elementwise(
        asm="{ .reg .b32 u; mul.rn.bf16x2 u, $2, $3; mov.b32 {$0, $1}, u; }",
        constraints="=h,=h,r,r", args=[pair, f2], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def _planes(pair, f2, ASM: tl.constexpr, DT: tl.constexpr):
    """The two weight planes of a pair tile: [B, BLOCK_N] each, times their blocks' factors (f2: [BLOCK_N] int32,
    the two bf16 factors packed as `_pair` packs weights), in DT."""
    if ASM:
        return _bf16x2_mul(pair, f2[None, :])
    lo = (pair << 16).to(tl.float32, bitcast=True) * (f2 << 16).to(tl.float32, bitcast=True)[None, :]
    hi = (pair & -65536).to(tl.float32, bitcast=True) * (f2 & -65536).to(tl.float32, bitcast=True)[None, :]
    return lo.to(DT), hi.to(DT)


@triton.jit
def _x_plane(x_ptr, s_ptr, rows_m, mm, stride_xm, k0, K, HAS_S: tl.constexpr, EVEN_K: tl.constexpr,
             SWAP: tl.constexpr, B: tl.constexpr, DT: tl.constexpr):
    """x[:, k0 : k0 + B] times s, in DT: [BLOCK_M, B], or [B, BLOCK_M] for SWAP (loaded transposed)."""
    kk = k0 + tl.arange(0, B)
    mk = (kk < K) | EVEN_K
    if SWAP:
        xt = tl.load(x_ptr + rows_m[None, :] * stride_xm + kk[:, None], mask=mk[:, None] & mm[None, :], other=0.0)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk, mask=mk, other=0.0)[:, None]
    else:
        xt = tl.load(x_ptr + rows_m[:, None] * stride_xm + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk, mask=mk, other=0.0)[None, :]
    return xt.to(DT)


@triton.jit
def _mma(acc, w, xt, SWAP: tl.constexpr, DOT_PREC: tl.constexpr):
    if SWAP:
        return tl.dot(tl.trans(w), xt, acc, input_precision=DOT_PREC)
    else:
        return tl.dot(xt, w, acc, input_precision=DOT_PREC)


# M and the split plan are not specialised on (value 1, multiples of 16): one compile per config for every row count
@triton.jit(do_not_specialize=["M", "G", "G_PER_SPLIT", "N_SPLIT", "USE_CNT"])
def _kgemm_kernel(x_ptr, w_ptr, f_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, G, G_PER_SPLIT,
                  N_SPLIT, USE_CNT, stride_xm,
                  FMT: tl.constexpr, B: tl.constexpr, HAS_S: tl.constexpr, HAS_P: tl.constexpr,
                  HAS_BIAS: tl.constexpr, DT: tl.constexpr, DOT_PREC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr, ASM: tl.constexpr,
                  EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, OMUL: tl.constexpr):
    """y[m, n] = sum_k (x[m, k] s[k]) w[n, k] (+ bias) from the plane layout (w_ptr words [G * B, N] int32,
    f_ptr factors [G * E / 2, N] int32, N their row stride); G groups in all, G_PER_SPLIT per K split (N_SPLIT of
    them; USE_CNT 0: the host sums the partials, else the kernel). Grid: (M tiles, K splits, N tiles): an N tile's
    M tiles run next to each other, so its weight is an L2 hit for all but the first."""
    E: tl.constexpr = 8 if FMT <= 1 else 4  # codes (planes) per word
    HALF: tl.constexpr = E // 2
    GROUP: tl.constexpr = E * B
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < M
    rows_m = offs_m.to(tl.int64)
    offs_i = tl.arange(0, B)
    g_lo = pid_k * G_PER_SPLIT
    g_hi = tl.minimum(g_lo + G_PER_SPLIT, G)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(g_lo, g_hi):
        # int32 offsets: a weight of < 2^31 words (8 GiB)
        w_ptrs = w_ptr + (g * B + offs_i)[:, None] * N + offs_n[None, :]
        f_row = f_ptr + g * HALF * N + offs_n
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=mn[None, :], other=0)
        for j in tl.static_range(HALF):
            if EVEN_N:
                f2 = tl.load(f_row + j * N)
            else:
                f2 = tl.load(f_row + j * N, mask=mn, other=0)
            w_lo, w_hi = _planes(_pair(w, j, FMT), f2, ASM, DT)
            x_lo = _x_plane(x_ptr, s_ptr, rows_m, mm, stride_xm, g * GROUP + j * B, K, HAS_S, EVEN_K, SWAP, B, DT)
            x_hi = _x_plane(x_ptr, s_ptr, rows_m, mm, stride_xm, g * GROUP + (j + HALF) * B, K, HAS_S, EVEN_K, SWAP,
                            B, DT)
            acc = _mma(acc, w_lo, x_lo, SWAP, DOT_PREC)
            acc = _mma(acc, w_hi, x_hi, SWAP, DOT_PREC)
    acc = acc * OMUL
    if HAS_P:
        acc = acc * tl.load(p_ptr)
    if SWAP:
        off = rows_m[None, :] * N + offs_n[:, None]
        mask = mn[:, None] & mm[None, :]
    else:
        off = rows_m[:, None] * N + offs_n[None, :]
        mask = mm[:, None] & mn[None, :]
    if HAS_BIAS:
        if pid_k == 0:
            bias = tl.load(b_ptr + offs_n, mask=mn, other=0.0).to(tl.float32)
            if SWAP:
                acc += bias[:, None]
            else:
                acc += bias[None, :]
    # run-time branches (uniform per program), so one compile serves every split count and reduction mode
    if N_SPLIT == 1:
        tl.store(y_ptr + off, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # fp32 partials; USE_CNT: the tile's last program sums them (the host otherwise)
        slab = tl.program_id(0).to(tl.int64) * 0 + M * N  # int64: M * N * splits may pass 2^31
        tl.store(part_ptr + pid_k * slab + off, acc, mask=mask)
        if USE_CNT != 0:
            tile = pid_n * tl.num_programs(0) + pid_m
            tl.debug_barrier()  # every thread's partial is issued before the counter moves
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if done == N_SPLIT - 1:  # in split order: deterministic; then the counter is reset for the next call
                tot = tl.load(part_ptr + off, mask=mask, other=0.0, cache_modifier=".cg")
                for j in range(1, N_SPLIT):
                    tot += tl.load(part_ptr + j * slab + off, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + off, tot.to(y_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)
