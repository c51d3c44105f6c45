"""Plain-torch reference of `mamba2_decode` (semantics of mamba_ssm's `selective_state_update`,
Mamba-2 flavour: one dt / A per head). fp32 math; the state is stored back in its own dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def mamba2_decode_ref(state, x, dt, A, B, C, D, dt_bias, slot_ids, z=None, out=None):
    batch, H, P = x.shape
    rep = H // B.shape[1]
    f32 = torch.float32
    y = torch.zeros(batch, H, P, dtype=f32, device=x.device)
    rows = (slot_ids >= 0).nonzero().squeeze(1)
    if rows.numel():
        slots = slot_ids[rows].long()
        S = state[slots].to(f32)  # [b, H, P, N]
        d = F.softplus(dt[rows].to(f32) + dt_bias.to(f32))  # [b, H]
        dA = torch.exp(d * A.to(f32))
        xr = x[rows].to(f32)
        Bh = B[rows].to(f32).repeat_interleave(rep, dim=1)  # [b, H, N]
        Ch = C[rows].to(f32).repeat_interleave(rep, dim=1)
        S = S * dA[..., None, None] + (d[..., None] * xr)[..., None] * Bh[:, :, None, :]
        yr = (S * Ch[:, :, None, :]).sum(-1) + D.to(f32)[:, None] * xr
        if z is not None:
            yr = yr * F.silu(z[rows].to(f32))
        state[slots] = S.to(state.dtype)
        y[rows] = yr
    if out is None:
        return y.to(x.dtype)
    return out.copy_(y)
