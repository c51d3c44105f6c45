"""DFlash2's grouped dynamic causal convolution over blocks of rows (the drafter's DynamicConv, inference):

    kern[t, c, j] = dyn[t, c // G, j] + base[c, j]
    out[t, c] = x[t, c] + kern[t, c, 0] * x[t, c] + sum_{j >= 1} kern[t, c, j] * x[t - j, c] * [t - j >= start[t]]

x [B, N, H]; dyn [B, N, (H / G) * taps] (the conv's proj(x)); base [H, taps]; start [B, N] long: the first row
of each row's block (x[t - j] outside t's block counts zero). One launch instead of the ~8 small kernels of the
torch form; no autograd (the drafter trains through its torch form).
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import dynamic_conv_ref, tap_inside

__all__ = ["dynamic_conv", "dynamic_conv_ref", "tap_inside"]


def _check(x, dyn, base, start, group) -> None:
    if x.dim() != 3:
        raise ValueError(f"dynamic_conv: x: expected shape [B, N, H], got {tuple(x.shape)}")
    B, N, H = x.shape
    if base.dim() != 2 or base.shape[0] != H:
        raise ValueError(f"dynamic_conv: base: expected shape [H, taps] = [{H}, taps], got {tuple(base.shape)}")
    if group <= 0 or H % group:
        raise ValueError(f"dynamic_conv: group={group}: expected a divisor of H={H}")
    if tuple(dyn.shape) != (B, N, H // group * base.shape[1]):
        raise ValueError(f"dynamic_conv: dyn: expected shape [B, N, H / group * taps] = "
                         f"{(B, N, H // group * base.shape[1])}, got {tuple(dyn.shape)}")
    if tuple(start.shape) != (B, N) or start.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"dynamic_conv: start: expected int32/int64 shape [B, N] = {(B, N)}, got "
                         f"{start.dtype} {tuple(start.shape)}")
    if dyn.dtype != x.dtype or base.dtype != x.dtype:
        raise ValueError(f"dynamic_conv: dyn / base: expected x's dtype {x.dtype}, got {dyn.dtype} / {base.dtype}")


def dynamic_conv(x, dyn, base, start, group: int, *, inside=None, backend: str = "auto") -> torch.Tensor:
    """out [B, N, H] in x.dtype (see the module docstring). inside: tap_inside(start, taps) when the caller
    already has it (the reference's masks). backend: "auto" (Triton on CUDA, reference otherwise) | "triton" |
    "ref"; Triton rounds as the reference does op for op under the interpreter; compiled, its products and sums
    contract to FMAs (about one ulp of x's dtype apart)."""
    _check(x, dyn, base, start, group)
    if pick_backend(backend, x) == "ref":
        return dynamic_conv_ref(x, dyn, base, start, group, inside)
    from .triton_impl import dynamic_conv_triton

    return dynamic_conv_triton(x, dyn, base, start, group)
