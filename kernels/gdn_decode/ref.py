"""Plain-torch reference of `gdn_decode` (flash-linear-attention's fused recurrent gated delta
rule, one decode token). fp32 math; the state is stored back in its own dtype."""
from __future__ import annotations

import torch


def _l2norm(t: torch.Tensor) -> torch.Tensor:
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def gdn_decode_ref(state, q, k, v, g, beta, slot_ids, scale=None, use_qk_l2norm=True, out=None):
    batch, HV, V = v.shape
    K = q.shape[-1]
    rep = HV // q.shape[1]
    scale = K ** -0.5 if scale is None else scale
    f32 = torch.float32
    o = torch.zeros(batch, HV, V, dtype=f32, device=v.device)
    rows = (slot_ids >= 0).nonzero().squeeze(1)
    if rows.numel():
        slots = slot_ids[rows].long()
        S = state[slots].to(f32)  # [b, HV, V, K]
        qr, kr = q[rows].to(f32), k[rows].to(f32)
        if use_qk_l2norm:
            qr, kr = _l2norm(qr), _l2norm(kr)
        qr = (qr * scale).repeat_interleave(rep, dim=1)  # [b, HV, K]
        kr = kr.repeat_interleave(rep, dim=1)
        alpha = torch.exp(g[rows].to(f32))[..., None, None]
        S = S * alpha
        u = beta[rows].to(f32)[..., None] * (v[rows].to(f32) - (S * kr[:, :, None, :]).sum(-1))
        S = S + u[..., None] * kr[:, :, None, :]
        o[rows] = (S * qr[:, :, None, :]).sum(-1)
        state[slots] = S.to(state.dtype)
    if out is None:
        return o.to(v.dtype)
    return out.copy_(o)
