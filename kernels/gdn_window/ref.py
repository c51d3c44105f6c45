"""Plain-torch reference of `gdn_decode_window`: `gdn_decode_ref`'s step applied T times, carrying
the state as stored (rounded to the state dtype) from one position to the next. fp32 math."""
from __future__ import annotations

import torch

from ..gdn_decode.ref import _l2norm


def gdn_decode_window_ref(state, q, k, v, g, beta, src_ids, dst_ids, scale=None, use_qk_l2norm=True,
                          out=None):
    batch, T, HV, V = v.shape
    K = q.shape[-1]
    rep = HV // q.shape[2]
    scale = K ** -0.5 if scale is None else scale
    f32 = torch.float32
    o = torch.zeros(batch, T, HV, V, dtype=f32, device=v.device)
    rows = (src_ids >= 0).nonzero().squeeze(1)
    if rows.numel():
        S = state[src_ids[rows].long()].to(f32)  # [b, HV, V, K], gathered before any store
        dst = dst_ids[rows].long()
        for t in range(T):
            qr, kr = q[rows, t].to(f32), k[rows, t].to(f32)
            if use_qk_l2norm:
                qr, kr = _l2norm(qr), _l2norm(kr)
            qr = (qr * scale).repeat_interleave(rep, dim=1)  # [b, HV, K]
            kr = kr.repeat_interleave(rep, dim=1)
            alpha = torch.exp(g[rows, t].to(f32))[..., None, None]
            S = S * alpha
            u = beta[rows, t].to(f32)[..., None] * (v[rows, t].to(f32) - (S * kr[:, :, None, :]).sum(-1))
            S = S + u[..., None] * kr[:, :, None, :]
            o[rows, t] = (S * qr[:, :, None, :]).sum(-1)
            Sq = S.to(state.dtype)
            keep = dst[:, t] >= 0
            state[dst[keep, t]] = Sq[keep]
            S = Sq.to(f32)
    if out is None:
        return o.to(v.dtype)
    return out.copy_(o)
