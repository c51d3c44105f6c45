"""Triton kernel of `dequant`: one program per tile of BLOCK_N rows x G scale blocks.

A 4-bit byte holds two codes (even k in the low nibble); its two values are computed side by side (`tl.join`)
and stored as adjacent elements, so a program writes BLOCK_N contiguous runs of G * QBLOCK values. Element
decoders are bit-field arithmetic (exact; codec.py's for fp8 and the scales).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16
from ..quant_linear.codec import _e4m3, _e5m2, _scale

_FMT = {"mxfp4": 0, "nvfp4": 1, "mxfp8_e4m3": 2, "mxfp8_e5m2": 3}


@triton.jit
def _e2m1(c):
    """int32 E2M1 codes (0..15) -> fp32: e = 0 is m * 0.5, else 2^(e-1) (1 + m / 2); sign by an integer OR."""
    e = (c >> 1) & 3
    m = c & 1
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True))
    return (mag.to(tl.int32, bitcast=True) | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(w_ptr, sc_ptr, p_ptr, out_ptr, N, NBLK, stride_wn, stride_sn, stride_on,
                    FMT: tl.constexpr, QBLOCK: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
                    ROUND: tl.constexpr):
    """Tile: BLOCK_N rows x G scale blocks, codes as [BLOCK_N, G, bytes per block] (the scale broadcast over its
    block's bytes; no gathers), values stored as [BLOCK_N, G, QBLOCK] (4-bit: [.., bytes, 2], the byte's two codes
    side by side)."""
    PACKED: tl.constexpr = FMT <= 1
    BPB: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK  # code bytes per scale block
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    g = tl.program_id(1) * G + tl.arange(0, G)
    h = tl.arange(0, BPB)
    m2 = (rows < N)[:, None] & (g < NBLK)[None, :]
    m3 = m2[:, :, None]
    b = tl.load(w_ptr + rows[:, None, None] * stride_wn + (g * BPB)[None, :, None] + h[None, None, :], mask=m3,
                other=0).to(tl.int32)
    sc = _scale(tl.load(sc_ptr + rows[:, None] * stride_sn + g[None, :], mask=m2, other=0).to(tl.int32), FMT)
    if FMT == 1:
        sc = tl.load(p_ptr) * sc  # the reference's order: tensor scale times block scale, then times the element
    sc = sc[:, :, None]
    base = out_ptr + rows[:, None, None] * stride_on + (g * QBLOCK)[None, :, None]
    if PACKED:
        v = tl.join(_e2m1(b & 15) * sc, _e2m1(b >> 4) * sc)  # [BN, G, BPB, 2]: byte j -> k = 2 j, 2 j + 1
        ptrs = base[:, :, :, None] + (2 * h)[None, None, :, None] + tl.arange(0, 2)[None, None, None, :]
        mask = m3[:, :, :, None]
    else:
        v = (_e4m3(b) if FMT == 2 else _e5m2(b)) * sc
        ptrs = base + h[None, None, :]
        mask = m3
    if ROUND:  # interpreter, bf16 out: rounded here and stored as int16 bits (its bf16 cast truncates and flushes
        # subnormals; the GPU's cvt.rn rounds to nearest even and keeps them)
        v = ((_round_bf16(v).to(tl.int32, bitcast=True) >> 16) & 0xFFFF).to(tl.int16)
    tl.store(ptrs, v.to(out_ptr.dtype.element_ty), mask=mask)


def dequant_triton(q, dtype: torch.dtype, block_n: int = 16, block_b: int = 256, num_warps: int = 4) -> torch.Tensor:
    """block_b: code bytes per row of a tile (a multiple of the bytes per scale block)."""
    N, K = q.shape
    data, scale = q.data.contiguous(), q.scale.contiguous()
    nblk = scale.shape[1]
    bpb = q.spec.block // 2 if q.fmt in ("mxfp4", "nvfp4") else q.spec.block
    G = max(1, block_b // bpb)
    out = torch.empty(N, K, dtype=dtype, device=data.device)
    p = data if q.tensor_scale is None else q.tensor_scale.reshape(1).to(torch.float32)
    rnd = dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # see ROUND in the kernel
    grid = (triton.cdiv(N, block_n), triton.cdiv(nblk, G))
    _dequant_kernel[grid](data, scale, p, out.view(torch.int16) if rnd else out, N, nblk, data.stride(0),
                          scale.stride(0), out.stride(0), FMT=_FMT[q.fmt], QBLOCK=q.spec.block, BLOCK_N=block_n,
                          G=G, ROUND=rnd, num_warps=num_warps)
    return out
