"""Depthwise causal conv1d decode step over a conv-state cache (causal_conv1d_update semantics).

Per batch row b with slot s = slot_ids[b] >= 0, per channel c (window = state[s, c, :] then x[b, c]):
    out[b, c] = act(sum_j window[j] * weight[c, j] + bias[c]),  act = SiLU or identity
    state[s, c, :] = window[1:]          (shift by one, x appended; updated in place)
A padding row (slot id < 0) reads and writes no state and gets out = 0.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import conv1d_update_ref

__all__ = ["conv1d_update", "conv1d_update_ref", "new_conv_state"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def new_conv_state(num_slots: int, C: int, km1: int, *, dtype, device) -> torch.Tensor:
    """A zeroed conv-state cache [num_slots, C, width - 1] stored tap-major (memory [num_slots, width - 1, C]):
    each tap of a slot is one contiguous channel vector, so the kernel moves it with full-width vector loads
    and stores (channel-major rows hold 6-byte bf16 windows: short, latency-bound accesses). Any layout works
    with `conv1d_update`; this is the fast one."""
    return torch.zeros(num_slots, km1, C, dtype=dtype, device=device).transpose(1, 2)


def _check(x, conv_state, weight, bias, slot_ids, out) -> None:
    if conv_state.dim() != 3 or conv_state.shape[-1] < 1:
        raise ValueError(f"conv_state: expected shape [num_slots, C, width - 1], got {tuple(conv_state.shape)}")
    _, C, km1 = conv_state.shape
    if x.dim() != 2:
        raise ValueError(f"x: expected shape [batch, C] = [batch, {C}], got {tuple(x.shape)}")
    batch = x.shape[0]
    expect_shape("x", x, (batch, C), "[batch, C]")
    expect_shape("weight", weight, (C, km1 + 1), "[C, width]")
    if bias is not None:
        expect_shape("bias", bias, (C,), "[C]")
    expect_shape("slot_ids", slot_ids, (batch,), "[batch]")
    if slot_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_ids: expected dtype int32 or int64, got {slot_ids.dtype}")
    if out is not None:
        expect_shape("out", out, (batch, C), "[batch, C]")
    for name, t in (("x", x), ("conv_state", conv_state), ("weight", weight), ("bias", bias), ("out", out)):
        if t is not None and t.dtype not in _DTYPES:
            raise ValueError(f"{name}: expected dtype float32, bfloat16 or float16, got {t.dtype}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("slot_ids", slot_ids), ("out", out)):
        if t is not None and t.device != conv_state.device:
            raise ValueError(f"{name}: expected device {conv_state.device} (the conv state's), got {t.device}")


def conv1d_update(x, conv_state, weight, bias, slot_ids, *, silu: bool = True, out=None, backend="auto"):
    """One causal-conv decode step; returns out [batch, C] in x.dtype (or writes `out`).

    x [batch, C]; conv_state [num_slots, C, width - 1] (the last width - 1 inputs, oldest first),
    rows `slot_ids` updated in place; weight [C, width]; bias [C] or None; slot_ids [batch] int32/int64
    (negative: padding row, state untouched, out row = 0; non-negative ids distinct).
    x is stored into the state in the state's dtype. Triton: fp32 accumulation, one rounding to the
    output dtype; the reference computes as the model's torch path did (in the state's dtype).
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    """
    _check(x, conv_state, weight, bias, slot_ids, out)
    if pick_backend(backend, conv_state) == "ref":
        return conv1d_update_ref(x, conv_state, weight, bias, slot_ids, silu, out)
    from .triton_impl import conv1d_update_triton

    return conv1d_update_triton(x, conv_state, weight, bias, slot_ids, silu, out)
