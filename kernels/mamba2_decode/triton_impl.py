"""Triton kernel of `mamba2_decode`: one program per (batch row, head, tile of P rows).

Each program streams its [BLOCK_P, N] state tile once (load, update, store) with wide loads along
N (contiguous), and reads its small inputs (x tile, dt, B/C of the head's group). A padding row
(slot id < 0) reads and writes no state and stores y = 0. The step is bound by HBM bandwidth at
serving batch: 2 x state bytes per step, everything else is < 1 %.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._dispatch import round_flags, strides
from .._tl import _head_tile, _round_bf16, _slot_of, _softplus, _tile_mask


@triton.jit
def _mamba2_decode_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr, slot_ptr, z_ptr, y_ptr,
    s_slot, s_h, s_p, s_n,
    x_b, x_h, x_p,
    dt_b, dt_h,
    B_b, B_g, B_n,
    C_b, C_g, C_n,
    z_b, z_h, z_p,
    y_b, y_h, y_p,
    P: tl.constexpr, N: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr,
    ROUND_STATE: tl.constexpr, ROUND_OUT: tl.constexpr,
):
    b, h, pt, g = _head_tile(P, BLOCK_P, HEADS_PER_GROUP)
    slot, valid = _slot_of(slot_ptr, b)

    offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    # state rows: none for a padding row (its y row is still written, with zeros)
    s_mask_p = offs_p < tl.where(valid, P, 0)
    s_ptrs = state_ptr + slot * s_slot + h * s_h + offs_p[:, None] * s_p + offs_n[None, :] * s_n
    s_mask = _tile_mask(s_mask_p, mask_n, N, BLOCK_N)
    S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)

    x = tl.load(x_ptr + b * x_b + h * x_h + offs_p * x_p, mask=mask_p, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * dt_b + h * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32)
    dt = _softplus(dt)
    dA = tl.exp(dt * tl.load(A_ptr + h).to(tl.float32))
    Bv = tl.load(B_ptr + b * B_b + g * B_g + offs_n * B_n, mask=mask_n, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * C_b + g * C_g + offs_n * C_n, mask=mask_n, other=0.0).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)

    S = S * dA + (dt * x)[:, None] * Bv[None, :]
    if ROUND_STATE:
        tl.store(s_ptrs, _round_bf16(S).to(state_ptr.dtype.element_ty), mask=s_mask)
    else:
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)

    y = tl.sum(S * Cv[None, :], axis=1) + Dh * x
    if HAS_Z:
        zv = tl.load(z_ptr + b * z_b + h * z_h + offs_p * z_p, mask=mask_p, other=0.0).to(tl.float32)
        y = y * (zv * tl.sigmoid(zv))
    y = tl.where(valid, y, 0.0)
    if ROUND_OUT:
        y = _round_bf16(y)
    tl.store(y_ptr + b * y_b + h * y_h + offs_p * y_p, y.to(y_ptr.dtype.element_ty), mask=mask_p)


def default_config(state_dtype: torch.dtype, P: int, N: int, rows: int) -> tuple[int, int]:
    """(BLOCK_P, num_warps) for `rows` = batch x heads. Picked on an H200 (bench --sweep):
    a [BLOCK_P, N] state tile of 16 KiB with 8 warps was fastest or within 2 % of it at
    batch 32 and 256 (90-94 % of HBM at 256, fp32 state); at batch 1 (~1000 programs or fewer) all
    tile sizes land within ~1 µs, there P is split down to 8 rows to put ~1024 programs in flight."""
    elt = torch.finfo(state_dtype).bits // 8
    block_n = triton.next_power_of_2(N)
    block = max(1, min(triton.next_power_of_2(P), (16384 // elt) // block_n))
    while block > 8 and rows * triton.cdiv(P, block) < 1024:
        block //= 2
    return block, 8 if block * block_n * elt >= 16384 else 4


def resolve_config(state_dtype: torch.dtype, P: int, N: int, rows: int, block_p: int | None,
                   num_warps: int | None) -> tuple[int, int]:
    """(BLOCK_P, num_warps): default_config's, each overridden where given (shared with the window kernel)."""
    bp, nw = default_config(state_dtype, P, N, rows)
    return block_p or bp, num_warps or nw


def mamba2_decode_triton(state, x, dt, A, B, C, D, dt_bias, slot_ids, z=None, out=None,
                         *, block_p: int | None = None, num_warps: int | None = None):
    batch, H, P = x.shape
    N = state.shape[-1]
    G = B.shape[1]
    y = torch.empty_like(x) if out is None else out
    if batch == 0:
        return y
    block_p, num_warps = resolve_config(state.dtype, P, N, batch * H, block_p, num_warps)
    zz = z if z is not None else x  # placeholder pointer, never read when HAS_Z is False
    _mamba2_decode_kernel[(H * triton.cdiv(P, block_p), batch)](
        state, x, dt, A, B, C, D, dt_bias, slot_ids, zz, y, *strides(state, x, dt, B, C, zz, y),
        P=P, N=N, HEADS_PER_GROUP=H // G,
        BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(N), HAS_Z=z is not None,
        **round_flags(state, y),
        num_warps=num_warps,
    )
    return y
