"""Eager Mamba-2 decode step: `selective_state_update` semantics (one dt / A per head).

    S = S * exp(dt * A) + (dt * x) ⊗ B ;  y = S · C + D * x  [; y *= silu(z)]
with dt = softplus(dt + dt_bias), fp32 math, the state updated in place at `slot_ids`.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import mamba2_decode_ref

__all__ = ["mamba2_decode", "mamba2_decode_ref"]

_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)



def _check(state, x, dt, A, B, C, D, dt_bias, slot_ids, z, out) -> None:
    if state.dim() != 4:
        raise ValueError(f"state: expected shape [num_slots, H, P, N], got {tuple(state.shape)}")
    if state.dtype not in _STATE_DTYPES:
        raise ValueError(f"state: expected dtype float32 or bfloat16, got {state.dtype}")
    _, H, P, N = state.shape
    if x.dim() != 3:
        raise ValueError(f"x: expected shape [batch, H, P] = [batch, {H}, {P}], got {tuple(x.shape)}")
    batch = x.shape[0]
    expect_shape("x", x, (batch, H, P), "[batch, H, P]")
    expect_shape("dt", dt, (batch, H), "[batch, H]")
    expect_shape("A", A, (H,), "[H]")
    if B.dim() != 3 or B.shape[1] == 0 or H % B.shape[1]:
        raise ValueError(f"B: expected shape [batch, G, N] = [{batch}, G, {N}] with H={H} divisible "
                         f"by G, got {tuple(B.shape)}")
    G = B.shape[1]
    expect_shape("B", B, (batch, G, N), "[batch, G, N]")
    expect_shape("C", C, (batch, G, N), "[batch, G, N]")
    expect_shape("D", D, (H,), "[H]")
    expect_shape("dt_bias", dt_bias, (H,), "[H]")
    expect_shape("slot_ids", slot_ids, (batch,), "[batch]")
    if slot_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_ids: expected dtype int32 or int64, got {slot_ids.dtype}")
    if z is not None:
        expect_shape("z", z, (batch, H, P), "[batch, H, P]")
    if out is not None:
        expect_shape("out", out, (batch, H, P), "[batch, H, P]")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D),
                    ("dt_bias", dt_bias), ("slot_ids", slot_ids), ("z", z), ("out", out)):
        if t is not None and t.device != state.device:
            raise ValueError(f"{name}: expected device {state.device} (the state's), got {t.device}")


def mamba2_decode(state, x, dt, A, B, C, D, dt_bias, slot_ids, z=None, *, out=None, backend="auto"):
    """One Mamba-2 decode step; returns y [batch, H, P] in x.dtype (or writes `out`).

    state [num_slots, H, P, N] fp32/bf16, rows `slot_ids` updated in place (negative id: padding
    row, no state read/write, y row = 0); x [batch, H, P]; dt [batch, H] raw; A, D, dt_bias [H];
    B, C [batch, G, N] (head h uses group h // (H // G)); z optional [batch, H, P] gate.
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    Slot ids must be distinct among non-negative entries.
    """
    _check(state, x, dt, A, B, C, D, dt_bias, slot_ids, z, out)
    if pick_backend(backend, state) == "ref":
        return mamba2_decode_ref(state, x, dt, A, B, C, D, dt_bias, slot_ids, z, out)
    from .triton_impl import mamba2_decode_triton

    return mamba2_decode_triton(state, x, dt, A, B, C, D, dt_bias, slot_ids, z, out)
