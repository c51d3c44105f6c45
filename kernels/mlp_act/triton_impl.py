"""Triton kernel of `mlp_act`: one program per (row, block of BLOCK channels)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _mlp_act_kernel(g_ptr, u_ptr, y_ptr, D, g_m, u_m, y_m, SILU: tl.constexpr, BLOCK: tl.constexpr,
                    ROUND_OUT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # rows on grid axis 0: a long prefill may exceed axis 1's 65535
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < D
    g = tl.load(g_ptr + row * g_m + offs, mask=m, other=0.0).to(tl.float32)
    if SILU:
        y = g * tl.sigmoid(g) * tl.load(u_ptr + row * u_m + offs, mask=m, other=0.0).to(tl.float32)
    else:
        y = tl.maximum(g, 0.0)
        y = y * y
    if ROUND_OUT:  # the interpreter's fp32 -> bf16 cast truncates
        y = _round_bf16(y)
    tl.store(y_ptr + row * y_m + offs, y.to(y_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])  # a view whenever the leading dims collapse (else a copy)
    return t if t.stride(-1) == 1 else t.contiguous()


def mlp_act_triton(gate, up, act: str, *, block: int = 1024, num_warps: int = 4):
    g2 = _rows(gate)
    u2 = _rows(up) if up is not None else g2
    M, D = g2.shape
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if M and D:
        y2 = y.view(M, D)
        block = min(block, triton.next_power_of_2(D))
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        _mlp_act_kernel[(M, triton.cdiv(D, block))](
            g2, u2, y2, D, g2.stride(0), u2.stride(0), y2.stride(0), SILU=act == "silu", BLOCK=block,
            ROUND_OUT=interp and y.dtype == torch.bfloat16, num_warps=num_warps)
    return y
