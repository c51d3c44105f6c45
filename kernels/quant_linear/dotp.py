"""quant_linear's "dotp" kernel: tl.dot on weights decoded straight to bf16 in the MMA operand layout (M >= 3)."""
from __future__ import annotations

import triton
import triton.language as tl

from .dot import _dot_epilogue, _dot_tile, _fold

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
    _dot_epilogue(acc, p_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, offs_n, mn, rows_m, mm, M, N, pid_k,
                  pid_m * tl.num_programs(0) + pid_n, FMT, HAS_BIAS, SPLIT, SEM, OMUL)
