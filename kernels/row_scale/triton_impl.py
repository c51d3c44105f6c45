"""Triton kernel of `row_scale`: one program per (block of ROWS rows, block of BLOCK channels); s is loaded once
per program and reused by its rows."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._tl import _round_bf16


@triton.jit
def _row_scale_kernel(x_ptr, s_ptr, y_ptr, M, K, x_m, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                      ROUND_OUT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # rows on axis 0: no 65535 cap
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mk = offs < K
    m = (rows < M)[:, None] & mk[None, :]
    s = tl.load(s_ptr + offs, mask=mk, other=0.0)
    y = tl.load(x_ptr + rows[:, None] * x_m + offs[None, :], mask=m, other=0.0).to(tl.float32) * s[None, :]
    if ROUND_OUT:  # the interpreter's fp32 -> bf16 cast truncates
        y = _round_bf16(y)
    tl.store(y_ptr + rows[:, None] * K + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


def row_scale_triton(x: torch.Tensor, s: torch.Tensor, *, block: int = 1024, rows: int = 4,
                     num_warps: int = 4) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])  # a view whenever the leading dims collapse (else a copy)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if M and K:
        block = min(block, triton.next_power_of_2(K))
        rows = min(rows, triton.next_power_of_2(M))
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        _row_scale_kernel[(triton.cdiv(M, rows), triton.cdiv(K, block))](
            x2, s, y, M, K, x2.stride(0), ROWS=rows, BLOCK=block, ROUND_OUT=interp and y.dtype == torch.bfloat16,
            num_warps=num_warps)
    return y
