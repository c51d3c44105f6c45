"""quant_linear's "gemm" kernel: the packed GEMM for 2-256 rows (W4A16 MXFP4 / NVFP4, W8A16 MXFP8) over the
repacked weight layout of repack.py.

Per K tile the code bytes [BLOCK_N, BLOCK_K / E] (E = 2 codes per byte for 4-bit, 1 for 8-bit) are loaded as
they are stored (16 consecutive bytes per thread), decoded to bf16 bit patterns (dotp's `_dec_asm`: value * 2^-R,
exact), multiplied by the block scale * 2^(R - 64) (one bf16x2 multiply per two weights; the block of a byte is a
function of its unit u and k16 step c only, so the scales are loaded as [BLOCK_N, NU, 4]) and permuted logically
into the dot's k order (`_uperm`, no data movement: the layout of repack.py puts a thread's operand registers in
its own 16 bytes). The activations x * s (the DualQuant / SmoothQuant input-channel multiplier, fused in fp32) are
loaded as the unit halves each nibble plane covers: contiguous runs of 64, no register shuffles. fp32 accumulate;
the accumulator times 2^64 (and NVFP4's tensor scale), plus bias, in the epilogue.

Two orientations (config SWAP):
  * SWAP=1, acc[BLOCK_N, BLOCK_M] = dot(W, x^T): the weight is the MMA's wide side (wgmma M = 64 per warpgroup,
    read from the registers it was decoded in) and the rows its narrow N side (BLOCK_M >= 16; M = 2 padded);
    for small M.
  * SWAP=0, acc[BLOCK_M, BLOCK_N] = dot(x, W^T): the decoded weight goes through shared memory as the B operand,
    x is the A operand; for M >= 64, where x rows fill the MMA.
The grid runs the M tiles of an N tile next to each other (axis 0), so a weight tile read for one M tile is an L2
hit for the others. Split K as the other quant_linear kernels (`codec._store_out`: per-tile counter, the last
program sums the partials in order).

On the interpreter (no inline asm) or for fp16 / fp32 activations the same bit patterns go through fp32 and an
IEEE fp32 dot (exact, slow; bf16 cannot hold value * 2^-64 as fp16 would need).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dot import _dot_epilogue
from .dotp import _dec_asm, _dec_ref, _fold16, _wide


@triton.jit
def _uperm(w, R: tl.constexpr, NU: tl.constexpr):
    """[R, NU * 64] from storage order j = 16 t + 4 c + 2 h + p per unit to dot order kappa = 16 c + 8 h + 2 t + p."""
    return tl.reshape(tl.permute(tl.reshape(w, (R, NU, 4, 4, 2, 2)), (0, 1, 3, 4, 2, 5)), (R, NU * 64))


@triton.jit
def _plane(bits, f, BLOCK_N: tl.constexpr, NU: tl.constexpr, ASM: tl.constexpr):
    """Decoded bit patterns [BLOCK_N, NU * 64] times the per-(row, unit, k16 step) scale f [BLOCK_N, NU, 4], in
    dot order."""
    if not ASM:
        bits = _wide(bits)
    w = tl.reshape(bits, (BLOCK_N, NU, 4, 4, 4)) * f[:, :, None, :, None]
    return _uperm(tl.reshape(w, (BLOCK_N, NU * 64)), BLOCK_N, NU)


@triton.jit
def _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, kx, K, HAS_S: tl.constexpr, EVEN_X: tl.constexpr,
           DT: tl.constexpr, BLOCK_M: tl.constexpr, KB: tl.constexpr):
    """x [BLOCK_M, KB] at the k indices kx [NU, 64] (contiguous runs), times s, in the dot dtype."""
    ptrs = x_ptr + rows_m[:, None, None] * stride_xm + kx[None, :, :]
    if EVEN_X:
        xt = tl.load(ptrs)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kx)[None, :, :]
    else:
        mk = kx < K
        xt = tl.load(ptrs, mask=mm[:, None, None] & mk[None, :, :], other=0.0)
        if HAS_S:
            xt = xt.to(tl.float32) * tl.load(s_ptr + kx, mask=mk, other=0.0)[None, :, :]
    return tl.reshape(xt.to(DT), (BLOCK_M, KB))


@triton.jit
def _mma(acc, w, xt, SWAP: tl.constexpr, DOT_PREC: tl.constexpr):
    if SWAP:
        return tl.dot(w, tl.trans(xt), acc, input_precision=DOT_PREC)
    else:
        return tl.dot(xt, tl.trans(w), acc, input_precision=DOT_PREC)


@triton.jit
def _qgemm_kernel(x_ptr, w_ptr, sc_ptr, p_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, KP,
                  stride_xm, stride_wn, stride_sn,
                  FMT: tl.constexpr, QBLOCK: tl.constexpr, HAS_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                  SPLIT: tl.constexpr, SEM: tl.constexpr, DOT_DT: tl.constexpr, DOT_PREC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr,
                  ASM: tl.constexpr, EVEN_N: tl.constexpr, EVEN_X: tl.constexpr, SH: tl.constexpr,
                  SHMUL: tl.constexpr, OMUL: tl.constexpr):
    """y[m, n] = sum_k (x[m, k] s[k]) w[n, k] from the repacked codes (w_ptr [N, KP / E], sc_ptr [N, KP / QBLOCK]);
    see the module docstring. K: x's length (masks), KP: the padded weight length (a multiple of BLOCK_K)."""
    PACKED: tl.constexpr = FMT <= 1
    UC: tl.constexpr = 128 if PACKED else 64  # codes per 64-byte unit
    NU: tl.constexpr = BLOCK_K // UC
    KB: tl.constexpr = NU * 64  # code bytes per row of a tile
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows_n = offs_n.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < M
    rows_m = offs_m.to(tl.int64)
    offs_u = tl.arange(0, NU)
    offs_kb = tl.arange(0, KB)
    step = UC * offs_u[:, None] + 16 * tl.arange(0, 4)[None, :]  # [NU, 4]: a (unit, k16 step)'s first k
    half = UC * offs_u[:, None] + tl.arange(0, 64)[None, :]  # [NU, 64]: the k of the units' first halves
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, KP)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        k0 = tl.multiple_of(k, BLOCK_K)  # splits start at tile multiples, KP is one
        kb = tl.multiple_of(k0 // UC * 64, 64) + offs_kb
        w_ptrs = w_ptr + rows_n[:, None] * stride_wn + kb[None, :]
        sc_ptrs = sc_ptr + rows_n[:, None, None] * stride_sn + ((k0 + step) // QBLOCK)[None, :, :]
        if EVEN_N:
            byte = tl.load(w_ptrs)
            sc = tl.load(sc_ptrs)
        else:
            byte = tl.load(w_ptrs, mask=mn[:, None], other=0)
            sc = tl.load(sc_ptrs, mask=mn[:, None, None], other=0)
        f = _fold16(sc, FMT, SH, SHMUL, DOT_DT)
        if PACKED:
            if ASM:
                lo, hi = _dec_asm(byte, FMT)
            else:
                lo, hi = _dec_ref(byte, FMT)
            # the high nibbles are the units' second halves: their blocks are 64 / QBLOCK further on
            if EVEN_N:
                sc_hi = tl.load(sc_ptrs + 64 // QBLOCK)
            else:
                sc_hi = tl.load(sc_ptrs + 64 // QBLOCK, mask=mn[:, None, None], other=0)
            w_lo = _plane(lo, f, BLOCK_N, NU, ASM)
            w_hi = _plane(hi, _fold16(sc_hi, FMT, SH, SHMUL, DOT_DT), BLOCK_N, NU, ASM)
            x_lo = _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, k0 + half, K, HAS_S, EVEN_X, DOT_DT, BLOCK_M, KB)
            x_hi = _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, k0 + 64 + half, K, HAS_S, EVEN_X, DOT_DT, BLOCK_M,
                          KB)
            acc = _mma(acc, w_lo, x_lo, SWAP, DOT_PREC)
            acc = _mma(acc, w_hi, x_hi, SWAP, DOT_PREC)
        else:
            bits = _dec_asm(byte, FMT) if ASM else _dec_ref(byte, FMT)
            w = _plane(bits, f, BLOCK_N, NU, ASM)
            xt = _xtile(x_ptr, s_ptr, rows_m, mm, stride_xm, k0 + half, K, HAS_S, EVEN_X, DOT_DT, BLOCK_M, KB)
            acc = _mma(acc, w, xt, SWAP, DOT_PREC)
    if not SWAP:
        acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M], as the epilogue writes it
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_k,
                  pid_n * tl.num_programs(0) + pid_m, FMT, HAS_BIAS, SPLIT, SEM, OMUL)
