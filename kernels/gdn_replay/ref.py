"""Plain-torch reference of the Gated DeltaNet ReplaySSM kernels, row by row from the equations of
docs/replayssm.md in fp32. Same signatures and in-place effects as the public functions.

Eager step (state [V, K]): S <- e^g S;  u = beta (v - S k);  S <- S + u k^T;  o = S q
(k, q L2-normalised, q scaled by K^-1/2). The ring caches the corrected value u, the normalised k
and g, so the state after ring entries 0..n-1 is a plain decayed sum (Gam_j = sum_{i<=j} g_i):
    S_n = e^{Gam_{n-1}} S0 + sum_{j<n} e^{Gam_{n-1} - Gam_j} u_j k_j^T
"""
from __future__ import annotations

import torch

from ..replay_common import dequantize, flush_slots, store_state, verify_rows


def l2norm(t: torch.Tensor) -> torch.Tensor:
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # same eps as eager gdn_decode


def _prep_qk(q, k, scale, use_qk_l2norm):
    """q, k [..., Hk, K] -> fp32 (normalised) k, (normalised, scaled) q."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return q * scale, k


def _history(ring_u, ring_k, ring_g, s, n, rep):
    return (ring_u[s, :, :n].float(), ring_k[s, :, :n].float().repeat_interleave(rep, 0),
            ring_g[s, :, :n].float())                                  # [HV,n,V], [HV,n,K], [HV,n]


def _fold(S0, us, ks, gs):
    """Decayed sum: S after entries (u, k, g) [HV, n, ...] from S0 [HV, V, K]."""
    Gam = torch.cumsum(gs, -1)
    Gt = Gam[:, -1:] if Gam.shape[1] else torch.zeros_like(gs[:, :1])
    return torch.exp(Gt)[..., None] * S0 + torch.einsum("hj,hjv,hjk->hvk", torch.exp(Gt - Gam), us, ks)


def _window(S0, us, ks, gs, kw, qw, gw, bw, vw, route):
    """Outputs and corrected values of window tokens r = 0..T-1 after history (us, ks, gs).
    kw, qw [T, HV, K]; gw, bw [T, HV]; vw [T, HV, V]. route "state" rebuilds S before each token,
    "adjoint" uses S0 mat-vecs plus ring dot products (never forms S)."""
    T = kw.shape[0]
    u_all, k_all, g_all = us, ks, gs
    os_, u_new = [], []
    for r in range(T):
        Gam = torch.cumsum(torch.cat([g_all, gw[r][:, None]], 1), -1)        # [HV, n+1]
        Gs = Gam[:, -1:]
        decay = torch.exp(Gs - Gam[:, :-1])                                     # [HV, n]
        if route == "state":
            Sp = torch.exp(Gs)[..., None] * S0 + torch.einsum("hj,hjv,hjk->hvk", decay, u_all, k_all)
            Sk = torch.einsum("hvk,hk->hv", Sp, kw[r])
            Sq = torch.einsum("hvk,hk->hv", Sp, qw[r])
        else:
            Sk = (torch.exp(Gs) * torch.einsum("hvk,hk->hv", S0, kw[r])
                  + torch.einsum("hj,hjv->hv", decay * torch.einsum("hjk,hk->hj", k_all, kw[r]), u_all))
            Sq = (torch.exp(Gs) * torch.einsum("hvk,hk->hv", S0, qw[r])
                  + torch.einsum("hj,hjv->hv", decay * torch.einsum("hjk,hk->hj", k_all, qw[r]), u_all))
        u = bw[r][:, None] * (vw[r] - Sk)
        os_.append(Sq + u * (kw[r] * qw[r]).sum(-1, keepdim=True))
        u_new.append(u)
        u_all = torch.cat([u_all, u[:, None]], 1)
        k_all = torch.cat([k_all, kw[r][:, None]], 1)
        g_all = torch.cat([g_all, gw[r][:, None]], 1)
    return torch.stack(os_), torch.stack(u_new)                                 # [T, HV, V] each


def _read_s0(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s):
    if ckpt_lo is not None:
        return dequantize(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s])
    return dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s])


def _store(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s, S):
    store_state(ckpt[s], None if ckpt_scale is None else ckpt_scale[s], S)
    if ckpt_lo is not None:
        store_state(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s], S)


def gdn_replay_decode_ref(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, *, L,
                          scale=None, use_qk_l2norm=True, route="adjoint", ckpt_scale=None, ckpt_lo=None,
                          ckpt_lo_scale=None, advance=True):
    b, HV, V = v.shape
    Hk = q.shape[1]
    rep = HV // Hk
    qn, kn = _prep_qk(q, k, scale, use_qk_l2norm)                            # [b, Hk, K]
    o = torch.zeros(b, HV, V, dtype=v.dtype, device=v.device)
    for i in range(b):
        s = int(slot_ids[i])
        if s < 0:
            continue
        wp = int(write_pos[s])
        us, ks, gs = _history(ring_u, ring_k, ring_g, s, wp, rep)
        kt, qt = kn[i].repeat_interleave(rep, 0), qn[i].repeat_interleave(rep, 0)   # [HV, K]
        gt, bt, vt = g[i].float(), beta[i].float(), v[i].float()
        if wp >= L - 1:  # flush: rebuild, finish the step on the state, write the checkpoint
            Sp = _fold(dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]), us, ks, gs)
            Sp = torch.exp(gt)[:, None, None] * Sp
            u = bt[:, None] * (vt - torch.einsum("hvk,hk->hv", Sp, kt))
            St = Sp + u[..., None] * kt[:, None, :]
            _store(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s, St)
            ov = torch.einsum("hvk,hk->hv", St, qt)
            new_wp = 0
        else:
            S0 = _read_s0(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s)
            ov, u = _window(S0, us, ks, gs, kt[None], qt[None], gt[None], bt[None], vt[None], route)
            ov, u = ov[0], u[0]
            ring_u[s, :, wp] = u.to(ring_u.dtype)
            ring_k[s, :, wp] = kn[i].to(ring_k.dtype)
            ring_g[s, :, wp] = gt.to(ring_g.dtype)
            new_wp = wp + 1
        if advance:
            write_pos[s] = new_wp
        o[i] = ov.to(o.dtype)
    return o


def gdn_replay_verify_ref(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, *, L,
                          scale=None, use_qk_l2norm=True, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None):
    """Window inputs q/k [b,T,Hk,K], v [b,T,HV,V], g/beta [b,T,HV] -> o [b,T,HV,V]."""
    b, T, HV, V = v.shape
    Hk = q.shape[2]
    rep = HV // Hk
    qn, kn = _prep_qk(q, k, scale, use_qk_l2norm)                            # [b, T, Hk, K]
    o = torch.zeros(b, T, HV, V, dtype=v.dtype, device=v.device)
    for i, s, wp in verify_rows(slot_ids, write_pos, T, L):
        us, ks, gs = _history(ring_u, ring_k, ring_g, s, wp, rep)
        S0 = _read_s0(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s)
        ov, u = _window(S0, us, ks, gs, kn[i].repeat_interleave(rep, 1), qn[i].repeat_interleave(rep, 1),
                        g[i].float(), beta[i].float(), v[i].float(), "adjoint")
        o[i] = ov.to(o.dtype)
        ring_u[s, :, wp:wp + T] = u.transpose(0, 1).to(ring_u.dtype)
        ring_k[s, :, wp:wp + T] = kn[i].transpose(0, 1).to(ring_k.dtype)
        ring_g[s, :, wp:wp + T] = g[i].float().transpose(0, 1).to(ring_g.dtype)
    return o


def gdn_replay_flush_ref(ckpt, ring_u, ring_k, ring_g, write_pos, slot_ids, *, L, min_room=None,
                         ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, advance=True):
    HV = ckpt.shape[1]
    rep = HV // ring_k.shape[1]
    for s, wp in flush_slots(slot_ids, write_pos, L, min_room):
        S = _fold(dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]),
                  *_history(ring_u, ring_k, ring_g, s, wp, rep))
        _store(ckpt, ckpt_scale, ckpt_lo, ckpt_lo_scale, s, S)
        if advance:
            write_pos[s] = 0
