"""Eager speculative-verify window for Mamba-2 (the baseline: what vLLM does today).

A verify step runs the recurrence over a window of T = 1 + drafts tokens per sequence and writes
one full state per window position into a state slot, so the next step can start from the state
of the last accepted position (a request owns 1 + drafts slots). Per row b and position t:

    S_{-1} = state[src_ids[b]]                               (read once)
    S_t = S_{t-1} * exp(dt_t * A) + (dt_t * x_t) ⊗ B_t ;  y_t = S_t · C_t + D * x_t  [; * silu(z_t)]
    state[dst_ids[b, t]] = S_t

with dt_t = softplus(dt_t + dt_bias), fp32 math. Each position equals one `mamba2_decode` step
applied to the previous position's *stored* state (S_t is rounded to the state dtype before it is
carried on), so for any accepted prefix the states and outputs are the same as non-speculative
decoding, also for a bf16 state. With T = 1 and dst = src this is exactly `mamba2_decode`.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import mamba2_decode_window_ref

__all__ = ["mamba2_decode_window", "mamba2_decode_window_ref"]

_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT = (torch.int32, torch.int64)



def _check(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z, out) -> None:
    if state.dim() != 4:
        raise ValueError(f"state: expected shape [num_slots, H, P, N], got {tuple(state.shape)}")
    if state.dtype not in _STATE_DTYPES:
        raise ValueError(f"state: expected dtype float32 or bfloat16, got {state.dtype}")
    _, H, P, N = state.shape
    if x.dim() != 4 or x.shape[1] == 0:
        raise ValueError(f"x: expected shape [batch, T, H, P] = [batch, T, {H}, {P}] with T >= 1, "
                         f"got {tuple(x.shape)}")
    batch, T = x.shape[:2]
    expect_shape("x", x, (batch, T, H, P), "[batch, T, H, P]")
    expect_shape("dt", dt, (batch, T, H), "[batch, T, H]")
    expect_shape("A", A, (H,), "[H]")
    if B.dim() != 4 or B.shape[2] == 0 or H % B.shape[2]:
        raise ValueError(f"B: expected shape [batch, T, G, N] = [{batch}, {T}, G, {N}] with H={H} "
                         f"divisible by G, got {tuple(B.shape)}")
    G = B.shape[2]
    expect_shape("B", B, (batch, T, G, N), "[batch, T, G, N]")
    expect_shape("C", C, (batch, T, G, N), "[batch, T, G, N]")
    expect_shape("D", D, (H,), "[H]")
    expect_shape("dt_bias", dt_bias, (H,), "[H]")
    expect_shape("src_ids", src_ids, (batch,), "[batch]")
    expect_shape("dst_ids", dst_ids, (batch, T), "[batch, T]")
    for name, t in (("src_ids", src_ids), ("dst_ids", dst_ids)):
        if t.dtype not in _INT:
            raise ValueError(f"{name}: expected dtype int32 or int64, got {t.dtype}")
    if z is not None:
        expect_shape("z", z, (batch, T, H, P), "[batch, T, H, P]")
    if out is not None:
        expect_shape("out", out, (batch, T, H, P), "[batch, T, H, P]")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias),
                    ("src_ids", src_ids), ("dst_ids", dst_ids), ("z", z), ("out", out)):
        if t is not None and t.device != state.device:
            raise ValueError(f"{name}: expected device {state.device} (the state's), got {t.device}")


def mamba2_decode_window(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z=None, *, out=None,
                         backend="auto"):
    """Eager verify of a T-token window; returns y [batch, T, H, P] in x.dtype (or writes `out`).

    state [num_slots, H, P, N] fp32/bf16; x [batch, T, H, P]; dt [batch, T, H] raw; A, D, dt_bias [H];
    B, C [batch, T, G, N] (head h uses group h // (H // G)); z optional [batch, T, H, P] gate.
    src_ids [batch]: slot each row starts from; negative = padding row (no state read or write,
    y rows 0). dst_ids [batch, T]: slot receiving S_t; a negative entry skips that store (y_t is
    still computed). The source tile is loaded before any store, so dst_ids[b, t] may equal
    src_ids[b] (e.g. t = 0 reusing the source slot). Non-negative dst slots must be distinct over
    the whole batch and must not be another row's source slot.
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    """
    _check(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z, out)
    if pick_backend(backend, state) == "ref":
        return mamba2_decode_window_ref(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z, out)
    from .triton_impl import mamba2_decode_window_triton

    return mamba2_decode_window_triton(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z, out)
