"""Plain-torch reference of `mamba2_decode_window`: `mamba2_decode_ref`'s step applied T times,
carrying the state as stored (rounded to the state dtype) from one position to the next. fp32 math."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def mamba2_decode_window_ref(state, x, dt, A, B, C, D, dt_bias, src_ids, dst_ids, z=None, out=None):
    batch, T, H, P = x.shape
    rep = H // B.shape[2]
    f32 = torch.float32
    y = torch.zeros(batch, T, H, P, dtype=f32, device=x.device)
    rows = (src_ids >= 0).nonzero().squeeze(1)
    if rows.numel():
        S = state[src_ids[rows].long()].to(f32)  # [b, H, P, N], gathered before any store
        dst = dst_ids[rows].long()
        for t in range(T):
            d = F.softplus(dt[rows, t].to(f32) + dt_bias.to(f32))  # [b, H]
            dA = torch.exp(d * A.to(f32))
            xr = x[rows, t].to(f32)
            Bh = B[rows, t].to(f32).repeat_interleave(rep, dim=1)  # [b, H, N]
            Ch = C[rows, t].to(f32).repeat_interleave(rep, dim=1)
            S = S * dA[..., None, None] + (d[..., None] * xr)[..., None] * Bh[:, :, None, :]
            yr = (S * Ch[:, :, None, :]).sum(-1) + D.to(f32)[:, None] * xr
            if z is not None:
                yr = yr * F.silu(z[rows, t].to(f32))
            y[rows, t] = yr
            Sq = S.to(state.dtype)
            keep = dst[:, t] >= 0
            state[dst[keep, t]] = Sq[keep]
            S = Sq.to(f32)
    if out is None:
        return y.to(x.dtype)
    return out.copy_(y)
