"""Plain-torch reference of `dynamic_conv`: DFlash2's grouped dynamic causal convolution as the drafter's
DynamicConv computes it (synodic/spec/models/layers.py), op by op in x's dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def tap_inside(start: torch.Tensor, taps: int) -> list[torch.Tensor]:
    """Per tap j, [B, N, 1] bool: row t's input x[t - j] lies in t's block (start [B, N]: each row's block start)."""
    idx = torch.arange(start.shape[1], device=start.device)
    return [(idx - j >= start)[..., None] for j in range(taps)]


def dynamic_conv_ref(x, dyn, base, start, group: int, inside: list[torch.Tensor] | None = None):
    """x [B, N, H]; dyn [B, N, (H / group) * taps] (proj(x)); base [H, taps]; start [B, N]; inside:
    tap_inside(start, taps) when the caller has it."""
    B, N, H = x.shape
    taps = base.shape[-1]
    inside = tap_inside(start, taps) if inside is None else inside
    kern = dyn.view(B, N, H // group, taps).repeat_interleave(group, dim=2) + base
    out = x + kern[..., 0] * x  # tap 0: x[t] itself, always inside t's block (no shift, no mask)
    for j in range(1, taps):
        shifted = F.pad(x, (0, 0, j, 0))[:, :N]
        out = out + kern[..., j] * shifted * inside[j]
    return out
