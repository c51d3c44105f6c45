"""quant_linear's "tc" kernel: a tensor-core GEMM over the stored layout for the lean layers' larger row counts.

The weight stays as `QTensor` stores it (codes [N, K/2] 4-bit, even k in the low nibble; [N, K] 8-bit), with no
second copy. One K step is 64 code bytes a row (128 k for 4-bit formats, 64 for 8-bit):
  * the byte tile [BLOCK_N, 64] is decoded elementwise (dotp's `_dec_asm`: bf16 bit patterns value * 2^-R, exact)
    into the low-nibble plane (even k) and the high-nibble plane (odd k) and each is multiplied by its block scale
    * 2^(R - 64) (`_fold16`): both planes of a byte share its block, so a [BLOCK_N, blocks] scale tile reshaped
    over the plane is the whole scaling;
  * x's 128 contiguous k are loaded as they are and split into even / odd k in registers, so the two planes feed
    two dots (K order is free in a contraction) and no layout of x or w is permuted in memory;
  * the block scales are prefetched one step ahead into registers (the software pipeliner moves the code and x
    tiles through shared memory but leaves these small loads synchronous);
  * orientation SWAP=1 computes acc[BLOCK_N, BLOCK_M] = W x^T with the decoded weight as wgmma's register A
    operand (few rows); SWAP=0 computes acc[BLOCK_M, BLOCK_N] = x W^T (64 rows and more per tile).
fp32 accumulate; 2^64, NVFP4's tensor scale and the bias in the epilogue (`_dot_epilogue`, split K as the other
kernels). On the interpreter (no inline asm) or for fp16 / fp32 activations the same bit patterns go through fp32
and an IEEE fp32 dot (exact, slow).

Not routed: from 16 to 256 rows it runs within about 5 % of dotp (faster for MXFP4 at 64 rows, slower for NVFP4)
and 1.3-1.9x faster than the repacked-layout GEMM it replaced (H100, BENCHMARKS.md Q7), with no second weight copy;
like them it stays below the bf16 linear from 64 rows (0.4x at 256). docs/tuning/quant_linear.md says what was
tried and what is left.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dot import _dot_epilogue
from .dotp import _dec_asm, _dec_ref, _fold16, _wide


@triton.jit
def _scaled(bits, f, BLOCK_N: tl.constexpr, NB: tl.constexpr, ASM: tl.constexpr):
    """A plane's bit patterns [BLOCK_N, 64] times its block factors f [BLOCK_N, NB] (NB blocks of 64 / NB bytes)."""
    if not ASM:
        bits = _wide(bits)
    w = tl.reshape(bits, (BLOCK_N, NB, 64 // NB)) * f[:, :, None]
    return tl.reshape(w, (BLOCK_N, 64))


@triton.jit
def _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, kk, K, HAS_S: tl.constexpr, EVEN_K: tl.constexpr,
           DT: tl.constexpr):
    """x [BLOCK_M, len(kk)] at the contiguous k indices kk, times s, in the dot dtype."""
    if EVEN_K:
        xt = tl.load(x_ptr + rows_m[:, None] * stride_xm + kk[None, :], mask=mm[:, None], other=0.0)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk)[None, :]
    else:
        mk = kk < K
        xt = tl.load(x_ptr + rows_m[:, None] * stride_xm + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kk, mask=mk, other=0.0)[None, :]
    return xt.to(DT)


@triton.jit
def _mma(acc, w, xt, SWAP: tl.constexpr, DOT_PREC: tl.constexpr):
    if SWAP:
        acc = tl.dot(w, tl.trans(xt), acc, input_precision=DOT_PREC)
    else:
        acc = tl.dot(xt, tl.trans(w), acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def _qtc_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, K_PER_SPLIT,
                stride_xm, stride_wn, stride_sn,
                FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr, SEM: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr, ASM: tl.constexpr,
                EVEN_K: tl.constexpr, SH: tl.constexpr, SHMUL: tl.constexpr, OMUL: tl.constexpr):
    """y[m, n] = sum_k (x[m, k] s[k]) w[n, k] from the stored codes (w_ptr [N, K/2] or [N, K], sc_ptr [N, K/QBLOCK]);
    see the module docstring. K_PER_SPLIT: a multiple of the K step."""
    PACKED: tl.constexpr = FMT <= 1
    UK: tl.constexpr = 128 if PACKED else 64  # k per step: 64 code bytes a row
    NB: tl.constexpr = UK // QBLOCK  # blocks per step (per plane for 4-bit: a byte's two codes share a block)
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows_n = offs_n.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < M
    rows_m = offs_m.to(tl.int64)
    j = tl.arange(0, 64)
    g = tl.arange(0, NB)
    n_blocks = K // QBLOCK
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sc_row = sc_ptr + rows_n[:, None] * stride_sn
    gi = k_lo // QBLOCK + g
    sc = tl.load(sc_row + gi[None, :], mask=mn[:, None] & (gi < n_blocks)[None, :], other=0)
    for kt in range(k_lo, k_hi, UK):
        k0 = tl.multiple_of(kt, UK)  # splits start at step multiples
        gn = (k0 + UK) // QBLOCK + g
        sc_next = tl.load(sc_row + gn[None, :], mask=mn[:, None] & (gn < n_blocks)[None, :], other=0)
        f = _fold16(sc, FMT, SH, SHMUL, DOT_DT)
        b0 = k0 // 2 if PACKED else k0
        w_ptrs = w_ptr + rows_n[:, None] * stride_wn + (b0 + j)[None, :]
        if EVEN_K:
            byte = tl.load(w_ptrs, mask=mn[:, None], other=0)
        else:
            byte = tl.load(w_ptrs, mask=mn[:, None] & ((b0 + j) < K // (2 if PACKED else 1))[None, :], other=0)
        if PACKED:
            if ASM:
                lo, hi = _dec_asm(byte, FMT)
            else:
                lo, hi = _dec_ref(byte, FMT)
            xt = _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, k0 + tl.arange(0, 128), K, HAS_S, EVEN_K, DOT_DT)
            x_even, x_odd = tl.split(tl.reshape(xt, (BLOCK_M, 64, 2)))
            acc = _mma(acc, _scaled(lo, f, BLOCK_N, NB, ASM), x_even, SWAP, DOT_PREC)
            acc = _mma(acc, _scaled(hi, f, BLOCK_N, NB, ASM), x_odd, SWAP, DOT_PREC)
        else:
            bits = _dec_asm(byte, FMT) if ASM else _dec_ref(byte, FMT)
            xt = _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, k0 + j, K, HAS_S, EVEN_K, DOT_DT)
            acc = _mma(acc, _scaled(bits, f, BLOCK_N, NB, ASM), xt, SWAP, DOT_PREC)
        sc = sc_next
    if not SWAP:
        acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M], as the epilogue writes it
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_k,
                  pid_n * tl.num_programs(0) + pid_m, FMT, HAS_BIAS, SPLIT, SEM, OMUL)
