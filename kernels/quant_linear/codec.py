"""Element decoders, the in-kernel MXFP4 activation quantizer, the GEMV programs' tile setup and the split-K
output store, shared by the quant_linear kernels (`dot`, `dotp`, `gemv32`, `gemvh`; launched from `launch`)."""
from __future__ import annotations

import triton
import triton.language as tl

_SIGN2 = tl.constexpr(-2147450880)  # 0x80008000: the sign bits of both 16-bit halves of a word
_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + MAGIC) - MAGIC rounds |y| < 2^22 half-to-even in fp32


@triton.jit
def _with_sign(mag, c):
    # the code's sign bit set with an integer OR: -0 stays -0 (on the GPU a select of -mag / mag
    # compiled to +0 for code 0x80)
    return (mag.to(tl.int32, bitcast=True) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3(c):
    """int32 E4M3fn codes (0..255) -> fp32."""
    e = (c >> 3) & 15
    m = c & 7
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return _with_sign(mag, c)


@triton.jit
def _e5m2(c):
    """int32 E5M2 codes (0..255) -> fp32."""
    e = (c >> 2) & 31
    m = c & 3
    mag = tl.where(e == 0, m.to(tl.float32) * 0.0000152587890625,
                   (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True))
    mag = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), mag)
    return _with_sign(mag, c)


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
def _mxfp4_fake(x, AXIS: tl.constexpr):
    """x as [..., G, 32] blocks (the 32 along AXIS, the last)."""
    return _mxfp4_from_amax(x, tl.max(tl.abs(x), axis=AXIS, keep_dims=True))


@triton.jit
def _decode(codes, FMT: tl.constexpr, FP8_CVT: tl.constexpr = False):
    """int32 8-bit codes (FMT 2: E4M3, 3: E5M2) -> fp32 weights: bit-field arithmetic (default; exact, the
    same values as synodic.quant.elements' tables, NaN payloads aside), or with FP8_CVT the byte bitcast to
    tl.float8e4nv / tl.float8e5 and converted by the hardware (sm_89+; exact there too). The Triton 3.9
    interpreter's fp8 conversion is wrong for the special codes (E4M3 0x7F/0xFF give finite values, E5M2
    Inf/NaN codes too), so only the arithmetic decoder is tested bit for bit on CPU."""
    if FMT == 2:
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
def _gemv_tile(x_ptr, stride_xm, N, K, K_PER_SPLIT, QBLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, G: tl.constexpr, KW: tl.constexpr):
    """A GEMV program's tile (grid: N tiles, K splits, M tiles of BLOCK_M rows) and its K range: (pid_n, pid_k,
    pid_m, offs_n, mn, rows, m0, x0, offs_g, offs_w, offs_q, k_lo, k_hi, g_hi): N offsets / mask / int64 rows, the
    first x row m0 and its pointer x0, the G scale blocks, KW code words and QBLOCK codes of a K tile, the
    split's [k_lo, k_hi) and its last scale block g_hi. Statements in the kernels' original order (their PTX)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows = offs_n.to(tl.int64)
    m0 = pid_m * BLOCK_M
    x0 = x_ptr + m0.to(tl.int64) * stride_xm
    offs_g = tl.arange(0, G)
    offs_w = tl.arange(0, KW)
    offs_q = tl.arange(0, QBLOCK)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    return pid_n, pid_k, pid_m, offs_n, mn, rows, m0, x0, offs_g, offs_w, offs_q, k_lo, k_hi, k_hi // QBLOCK


@triton.jit
def _store_out(val, y_ptr, part_ptr, cnt_ptr, y_off, p_off, mask, pid_k, tile, slab,
               SPLIT: tl.constexpr, SEM: tl.constexpr):
    """Write an output tile. Split K: every program stores its fp32 partial; with SEM the last program of a
    tile (a per-tile counter, atomics acq_rel) sums the partials in split order (deterministic) and writes y,
    then resets the counter — no second kernel launch; without SEM the host sums them."""
    if SPLIT == 1:
        tl.store(y_ptr + y_off, val.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + pid_k * slab + p_off, val, mask=mask)
        if SEM:
            tl.debug_barrier()  # every thread's partial is issued before the counter moves
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT - 1:
                tot = tl.load(part_ptr + p_off, mask=mask, other=0.0, cache_modifier=".cg")
                for j in range(1, SPLIT):
                    tot += tl.load(part_ptr + j * slab + p_off, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + y_off, tot.to(y_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _shl(w, S: tl.constexpr):
    """w << S, or w >> -S (arithmetic) for S < 0: the callers mask off the sign-filled bits."""
    if S >= 0:
        return w << S
    else:
        return w >> (-S)


FMT_IDS = {"mxfp4": 0, "nvfp4": 1, "mxfp8_e4m3": 2, "mxfp8_e5m2": 3}  # the kernels' FMT constexpr
