"""Triton kernel of `dequant`: one program per tile of BLOCK_N rows x G scale blocks.

A 4-bit byte holds two codes (even k in the low nibble); its two values leave as one 32-bit word (64-bit for fp32
output), so loads and stores share the code bytes' layout. (Joining the two values into a [.., 2] tensor and
storing that was 4x slower on the H200.) Element decoders are bit-field arithmetic (exact; codec.py's for fp8 and
the scales).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16
from ..quant_linear.codec import FMT_IDS, _e4m3, _e5m2, _scale


@triton.jit
def _e2m1(c):
    """int32 E2M1 codes (0..15) -> fp32: e = 0 is m * 0.5, else 2^(e-1) (1 + m / 2); sign by an integer OR.
    The exact value itself (not quant_linear.dot's _bits_lo / _bits_hi, value * 2^-126 for kernels whose scale carries
    the 2^126): here it meets an arbitrary fp32 block scale, as in the reference."""
    e = (c >> 1) & 3
    m = c & 1
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True))
    return (mag.to(tl.int32, bitcast=True) | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _bits16(v, OUT: tl.constexpr, ROUND: tl.constexpr):
    """fp32 -> the 16-bit pattern of v in bf16 (OUT 1) / fp16 (OUT 2), rounded to nearest even, in an int32.
    ROUND (interpreter, bf16): rounded by integer arithmetic (its bf16 cast truncates and flushes subnormals; the
    GPU's cvt.rn rounds to nearest even and keeps them)."""
    if OUT == 1:
        if ROUND:
            return (_round_bf16(v).to(tl.int32, bitcast=True) >> 16) & 0xFFFF
        return v.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _dequant_kernel(w_ptr, sc_ptr, p_ptr, out_ptr, N, NBLK, stride_wn, stride_sn, stride_on,
                    FMT: tl.constexpr, QBLOCK: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
                    OUT: tl.constexpr, ROUND: tl.constexpr):
    """Tile: BLOCK_N rows x G scale blocks, codes as [BLOCK_N, G, bytes per block] (the scale broadcast over its
    block's bytes). 4-bit: a byte's two values leave as one word, (even k, odd k) in its (low, high) half, into
    the output viewed as int32 (16-bit outputs; out_ptr's stride in words) or int64 (fp32), so the store has the
    code bytes' layout; 8-bit: one value per byte."""
    PACKED: tl.constexpr = FMT <= 1
    BPB: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK  # code bytes per scale block
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    g = tl.program_id(1) * G + tl.arange(0, G)
    h = tl.arange(0, BPB)
    m2 = (rows < N)[:, None] & (g < NBLK)[None, :]
    mask = m2[:, :, None]
    col = (g * BPB)[None, :, None] + h[None, None, :]  # byte column (4-bit: output word column)
    b = tl.load(w_ptr + rows[:, None, None] * stride_wn + col, mask=mask, other=0).to(tl.int32)
    sc = _scale(tl.load(sc_ptr + rows[:, None] * stride_sn + g[None, :], mask=m2, other=0).to(tl.int32), FMT)
    if FMT == 1:
        sc = tl.load(p_ptr) * sc  # the reference's order: tensor scale times block scale, then times the element
    sc = sc[:, :, None]
    ptrs = out_ptr + rows[:, None, None] * stride_on + col
    if PACKED:
        lo = _e2m1(b & 15) * sc
        hi = _e2m1(b >> 4) * sc
        if OUT == 0:
            word = (lo.to(tl.uint32, bitcast=True).to(tl.int64)
                    | (hi.to(tl.uint32, bitcast=True).to(tl.int64) << 32))
        else:
            word = _bits16(lo, OUT, ROUND) | (_bits16(hi, OUT, ROUND) << 16)
        tl.store(ptrs, word, mask=mask)
    else:
        v = (_e4m3(b) if FMT == 2 else _e5m2(b)) * sc
        if ROUND:
            tl.store(ptrs, _bits16(v, OUT, ROUND).to(tl.int16), mask=mask)
        else:
            tl.store(ptrs, v.to(out_ptr.dtype.element_ty), mask=mask)


# (BLOCK_N, code bytes per tile row, warps): the best of a 44-config sweep on both 4096x14336 and 14336x4096
# (docs/tuning/quant_dequant.md)
_CONFIG = {"mxfp4": (16, 256, 4), "nvfp4": (4, 1024, 4), "mxfp8_e4m3": (64, 256, 4), "mxfp8_e5m2": (64, 256, 4)}
_OUT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def dequant_triton(q, dtype: torch.dtype, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """config: (BLOCK_N, code bytes per tile row (rounded to whole scale blocks), num_warps)."""
    N, K = q.shape
    packed = q.fmt in ("mxfp4", "nvfp4")
    block_n, block_b, num_warps = config or _CONFIG[q.fmt]
    data, scale = q.data.contiguous(), q.scale.contiguous()
    nblk = scale.shape[1]
    G = max(1, block_b // (q.spec.block // 2 if packed else q.spec.block))
    out = torch.empty(N, K, dtype=dtype, device=data.device)
    p = data if q.tensor_scale is None else q.tensor_scale.reshape(1).to(torch.float32)
    rnd = dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # see _bits16
    if packed:  # two values per store: the output as words of two
        view = out.view(torch.int64 if dtype == torch.float32 else torch.int32)
    else:
        view = out.view(torch.int16) if rnd else out
    grid = (triton.cdiv(N, block_n), triton.cdiv(nblk, G))
    _dequant_kernel[grid](data, scale, p, view, N, nblk, data.stride(0), scale.stride(0), view.stride(0),
                          FMT=FMT_IDS[q.fmt], QBLOCK=q.spec.block, BLOCK_N=block_n, G=G, OUT=_OUT[dtype], ROUND=rnd,
                          num_warps=num_warps)
    return out
