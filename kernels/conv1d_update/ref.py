"""Plain-torch reference of `conv1d_update`: the computation the SSM backends' `conv_step` did before
the fused kernel (window built in the conv state's dtype, (window * weight).sum(-1) + bias, SiLU,
cast to x.dtype), restricted to non-padding rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def conv1d_update_ref(x, conv_state, weight, bias, slot_ids, silu=True, out=None):
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device) if out is None else out.zero_()
    rows = (slot_ids >= 0).nonzero().squeeze(1)
    if rows.numel():
        slots = slot_ids[rows].long()
        full = torch.cat([conv_state[slots], x[rows, :, None].to(conv_state.dtype)], dim=-1)
        conv_state[slots] = full[..., 1:]
        yr = (full * weight).sum(-1)
        if bias is not None:
            yr = yr + bias
        if silu:
            yr = F.silu(yr)
        y[rows] = yr.to(y.dtype)
    return y
