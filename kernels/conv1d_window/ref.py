"""Plain-torch references of `conv1d_window` / `conv1d_window_commit`: the computation the SSM backends'
conv_window / commit did before the fused kernels (window built in the conv state's dtype, one
(window * weight).sum(-1) per position, + bias, SiLU, cast to x.dtype; commit gathers the last width - 1
kept inputs of that window)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _full(x, conv_state, rows):
    """[B, C, width - 1 + T]: each row's committed taps, then its window inputs (in the state's dtype)."""
    return torch.cat([conv_state[rows], x.transpose(1, 2).to(conv_state.dtype)], dim=-1)


def conv1d_window_ref(x, conv_state, weight, bias, rows, silu=True):
    k = weight.shape[-1]
    full = _full(x, conv_state, rows)
    y = torch.stack([(full[..., t:t + k] * weight).sum(-1) for t in range(x.shape[1])], dim=1)
    if bias is not None:
        y = y + bias
    return (F.silu(y) if silu else y).to(x.dtype)


def conv1d_window_commit_ref(x, conv_state, rows, accepted):
    full = _full(x, conv_state, rows)
    km1 = conv_state.shape[-1]
    idx = accepted.long()[:, None] + torch.arange(km1, device=full.device)  # last k-1 kept inputs
    kept = full.gather(-1, idx[:, None, :].expand(-1, full.shape[1], -1))
    conv_state.index_copy_(0, rows, kept)
