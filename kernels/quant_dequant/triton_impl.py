"""Triton kernel of `dequant`: one program per [BLOCK_N, BLOCK_B] tile of code bytes.

A 4-bit byte holds two codes (even k in the low nibble); its two values are computed side by side and
interleaved (`tl.join`), so each program writes a contiguous [BLOCK_N, 2 BLOCK_B] output tile. Every byte reads
its block's scale (one gathered load per byte; the B / 2 (4-bit) or B (8-bit) bytes of a block hit the same
L1 line). Element decoders are bit-field arithmetic (exact; codec.py's for fp8 and the scales).
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
def _dequant_kernel(w_ptr, sc_ptr, p_ptr, out_ptr, N, NB, stride_wn, stride_sn, stride_on,
                    FMT: tl.constexpr, QBLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                    ROUND: tl.constexpr):
    PACKED: tl.constexpr = FMT <= 1
    BPB: tl.constexpr = QBLOCK // 2 if PACKED else QBLOCK  # code bytes per scale block
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (rows < N)[:, None] & (cols < NB)[None, :]
    b = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=mask, other=0).to(tl.int32)
    sc = _scale(tl.load(sc_ptr + rows[:, None] * stride_sn + (cols // BPB)[None, :], mask=mask, other=0).to(tl.int32),
                FMT)
    if FMT == 1:
        sc = tl.load(p_ptr) * sc  # the reference's order: tensor scale times block scale, then times the element
    if PACKED:
        v = tl.join(_e2m1(b & 15) * sc, _e2m1(b >> 4) * sc)  # [BN, BB, 2]: byte j -> k = 2 j, 2 j + 1
        v = tl.reshape(v, (BLOCK_N, 2 * BLOCK_B))
        ocols = tl.program_id(1) * (2 * BLOCK_B) + tl.arange(0, 2 * BLOCK_B)
        omask = (rows < N)[:, None] & (ocols < 2 * NB)[None, :]
    else:
        v = (_e4m3(b) if FMT == 2 else _e5m2(b)) * sc
        ocols = cols
        omask = mask
    if ROUND:  # interpreter, bf16 out: rounded here and stored as int16 bits (its bf16 cast truncates and flushes
        # subnormals; the GPU's cvt.rn rounds to nearest even and keeps them)
        v = ((_round_bf16(v).to(tl.int32, bitcast=True) >> 16) & 0xFFFF).to(tl.int16)
    tl.store(out_ptr + rows[:, None] * stride_on + ocols[None, :], v.to(out_ptr.dtype.element_ty), mask=omask)


def dequant_triton(q, dtype: torch.dtype, block_n: int = 16, block_b: int = 256, num_warps: int = 4) -> torch.Tensor:
    N, K = q.shape
    data, scale = q.data.contiguous(), q.scale.contiguous()
    nb = data.shape[1]
    out = torch.empty(N, K, dtype=dtype, device=data.device)
    p = data if q.tensor_scale is None else q.tensor_scale.reshape(1).to(torch.float32)
    rnd = dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # see ROUND in the kernel
    grid = (triton.cdiv(N, block_n), triton.cdiv(nb, block_b))
    _dequant_kernel[grid](data, scale, p, out.view(torch.int16) if rnd else out, N, nb, data.stride(0),
                          scale.stride(0), out.stride(0), FMT=_FMT[q.fmt], QBLOCK=q.spec.block, BLOCK_N=block_n,
                          BLOCK_B=block_b, ROUND=rnd, num_warps=num_warps)
    return out
