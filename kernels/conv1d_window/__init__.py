"""Depthwise causal conv1d over a verify window from a conv-state cache, and the commit of its accepted prefix
(the SSM backends' conv_window / commit for speculative windows).

Per batch row b with state row r = rows[b], channel c, window w = [state[r, c, :], x[b, :, c]] (width - 1
committed taps, then the T window inputs in the state's dtype):
    conv1d_window:         out[b, t, c] = act(sum_j w[t + j] * weight[c, j] + bias[c]),  act = SiLU or identity
                           (no state written: the window is not committed yet)
    conv1d_window_commit:  state[r, c, :] = w[accepted[b] : accepted[b] + width - 1]   (in place; accepted in 1..T)
Padding rows point at a scratch row (rows may repeat only there). One launch each per layer instead of the
~13 small ops a layer the torch form takes (a gather, a cat, a product and a sum per position, a stack ...).
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import conv1d_window_commit_ref, conv1d_window_ref

__all__ = ["conv1d_window", "conv1d_window_commit", "conv1d_window_ref", "conv1d_window_commit_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(name, x, conv_state, rows, weight=None, bias=None) -> None:
    if conv_state.dim() != 3 or conv_state.shape[-1] < 1:
        raise ValueError(f"{name}: conv_state: expected shape [num_slots, C, width - 1], got "
                         f"{tuple(conv_state.shape)}")
    _, C, km1 = conv_state.shape
    if x.dim() != 3 or x.shape[-1] != C:
        raise ValueError(f"{name}: x: expected shape [batch, T, C] = [batch, T, {C}], got {tuple(x.shape)}")
    expect_shape("rows", rows, (x.shape[0],), "[batch]")
    if rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: rows: expected dtype int32 or int64, got {rows.dtype}")
    if weight is not None:
        expect_shape("weight", weight, (C, km1 + 1), "[C, width]")
    if bias is not None:
        expect_shape("bias", bias, (C,), "[C]")
    for n, t in (("x", x), ("conv_state", conv_state), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in _DTYPES:
            raise ValueError(f"{name}: {n}: expected dtype float32, bfloat16 or float16, got {t.dtype}")
    for n, t in (("x", x), ("weight", weight), ("bias", bias), ("rows", rows)):
        if t is not None and t.device != conv_state.device:
            raise ValueError(f"{name}: {n}: expected device {conv_state.device} (the conv state's), got {t.device}")


def conv1d_window(x, conv_state, weight, bias, rows, *, silu: bool = True, backend: str = "auto") -> torch.Tensor:
    """The causal conv of a window x [batch, T, C] after each row's committed taps conv_state[rows] ([num_slots,
    C, width - 1], not written); weight [C, width], bias [C] or None, rows [batch] int32/int64. Returns [batch,
    T, C] in x.dtype. Triton: fp32 accumulation and one rounding (as conv1d_update); the reference computes as
    the backends' torch path did (in the state's dtype). backend: "auto" | "triton" | "ref"."""
    _check("conv1d_window", x, conv_state, rows, weight, bias)
    if pick_backend(backend, conv_state) == "ref":
        return conv1d_window_ref(x, conv_state, weight, bias, rows, silu)
    from .triton_impl import conv1d_window_triton

    return conv1d_window_triton(x, conv_state, weight, bias, rows, silu)


def conv1d_window_commit(x, conv_state, rows, accepted, *, backend: str = "auto") -> None:
    """Keep accepted[b] (device, 1..T) of row b's window inputs x [batch, T, C]: conv_state[rows[b]] becomes the
    last width - 1 taps of [conv_state[rows[b]], x[b, :accepted[b]]] (in place, exact copies)."""
    _check("conv1d_window_commit", x, conv_state, rows)
    expect_shape("accepted", accepted, (x.shape[0],), "[batch]")
    if pick_backend(backend, conv_state) == "ref":
        return conv1d_window_commit_ref(x, conv_state, rows, accepted)
    from .triton_impl import conv1d_window_commit_triton

    return conv1d_window_commit_triton(x, conv_state, rows, accepted)
