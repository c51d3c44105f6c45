"""Whole-sequence SSM scans in plain torch, for prefill and training.

Chunked forms (SSD for Mamba-2, the WY / triangular-solve form for the gated delta rule) keep the
Python loop at T / chunk iterations and are differentiable; `*_sequential` are the step-by-step
definitions the tests hold them to.
"""
import torch
import torch.nn.functional as F


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """a [..., l] -> [..., l, l] with out[i, j] = sum a[j+1..i] for j <= i, -inf above the diagonal."""
    cs = a.cumsum(-1)
    out = cs[..., :, None] - cs[..., None, :]
    mask = torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~mask, float("-inf"))


def mamba2_chunked(x, dt, A, B, C, chunk: int, state=None):
    """x [b,T,H,P], dt [b,T,H] (post softplus), A [H], B/C [b,T,G,N], state [b,H,P,N] fp32.

    Returns y [b,T,H,P] (fp32, no D skip) and the final state. S_t = e^{dt A} S + dt x Bᵀ, y = S C.
    """
    b, T, H, P = x.shape
    G = B.shape[2]
    rep = H // G
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    Bh = B.repeat_interleave(rep, dim=2)  # [b,T,H,N]
    Ch = C.repeat_interleave(rep, dim=2)
    S = x.new_zeros(b, H, P, B.shape[-1]) if state is None else state.float()
    ys = []
    for s in range(0, T, chunk):
        xs, dts, Bs, Cs = x[:, s:s + chunk], dt[:, s:s + chunk], Bh[:, s:s + chunk], Ch[:, s:s + chunk]
        a = (dts * A.float()).transpose(1, 2)  # [b,H,l]
        cs = a.cumsum(-1)
        decay = torch.exp(_segsum(a))  # [b,H,l,l]
        cb = torch.einsum("blhn,bshn->bhls", Cs, Bs) * decay * dts.transpose(1, 2)[:, :, None, :]
        y_in = torch.einsum("bhls,bshp->blhp", cb, xs)
        y_off = torch.einsum("bhpn,blhn->blhp", S, Cs) * torch.exp(cs).transpose(1, 2)[..., None]
        ys.append(y_in + y_off)
        w = torch.exp(cs[..., -1:] - cs) * dts.transpose(1, 2)  # [b,H,l]
        S = S * torch.exp(cs[..., -1])[..., None, None] + torch.einsum("bhs,bshp,bshn->bhpn", w, xs, Bs)
    return torch.cat(ys, dim=1), S


def mamba2_sequential(x, dt, A, B, C, state=None):
    b, T, H, P = x.shape
    rep = H // B.shape[2]
    S = x.new_zeros(b, H, P, B.shape[-1], dtype=torch.float32) if state is None else state.float()
    ys = []
    for t in range(T):
        Bt = B[:, t].float().repeat_interleave(rep, dim=1)
        Ct = C[:, t].float().repeat_interleave(rep, dim=1)
        dA = torch.exp(dt[:, t].float() * A.float())
        S = S * dA[..., None, None] + (dt[:, t, :, None].float() * x[:, t].float())[..., None] * Bt[:, :, None]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ct))
    return torch.stack(ys, 1), S


def gdn_chunked(q, k, v, g, beta, chunk: int, state=None):
    """Gated delta rule. q/k [b,T,HV,K] (already normalised, q scaled), v [b,T,HV,V], g/beta [b,T,HV].

    State S [b,HV,V,K]: u_t = β_t (v_t − α_t S_{t−1} k_t), S_t = α_t S_{t−1} + u_t k_tᵀ, o_t = S_t q_t.
    Per chunk, the corrections solve (I + A) U = β (V − e^G S K), A_tj = β_t e^{G_t−G_j} k_t·k_j (j<t).
    """
    b, T, HV, K = k.shape
    V = v.shape[-1]
    q, k, v, g, beta = (t.float().transpose(1, 2) for t in (q, k, v, g, beta))  # [b,HV,T,...]
    S = q.new_zeros(b, HV, V, K) if state is None else state.float()
    outs = []
    for s in range(0, T, chunk):
        qs, ks, vs, gs, bs = (t[:, :, s:s + chunk] for t in (q, k, v, g, beta))
        l = ks.shape[2]
        G = gs.cumsum(-1)  # [b,HV,l]
        diff = G[..., :, None] - G[..., None, :]
        strict = torch.ones(l, l, dtype=torch.bool, device=q.device).tril(-1)
        lower = torch.ones(l, l, dtype=torch.bool, device=q.device).tril()
        kk = ks @ ks.transpose(-1, -2)
        A = torch.where(strict, bs[..., :, None] * torch.exp(diff.masked_fill(~strict, 0)) * kk, 0.0)
        R = bs[..., None] * (vs - torch.exp(G)[..., None] * (ks @ S.transpose(-1, -2)))
        eye = torch.eye(l, device=q.device, dtype=q.dtype)
        U = torch.linalg.solve_triangular(eye + A, R, upper=False, unitriangular=True)
        qk = torch.where(lower, torch.exp(diff.masked_fill(~lower, 0)) * (qs @ ks.transpose(-1, -2)), 0.0)
        o = torch.exp(G)[..., None] * (qs @ S.transpose(-1, -2)) + qk @ U
        outs.append(o)
        w = torch.exp(G[..., -1:] - G)  # [b,HV,l]
        S = S * torch.exp(G[..., -1])[..., None, None] + (U * w[..., None]).transpose(-1, -2) @ ks
    return torch.cat(outs, 2).transpose(1, 2), S


def gdn_sequential(q, k, v, g, beta, state=None):
    b, T, HV, K = k.shape
    S = q.new_zeros(b, HV, v.shape[-1], K, dtype=torch.float32) if state is None else state.float()
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t].float())[..., None, None]
        kt, qt = k[:, t].float(), q[:, t].float()
        u = beta[:, t].float()[..., None] * (v[:, t].float() - torch.einsum("bhvk,bhk->bhv", S, kt))
        S = S + u[..., None] * kt[:, :, None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", S, qt))
    return torch.stack(outs, 1), S


def causal_conv(x, weight, bias, conv_state=None):
    """Depthwise causal conv + SiLU. x [b,T,C], weight [C,k], conv_state [b,C,k-1] (prior inputs).

    Returns y [b,T,C] and the new conv state (last k−1 inputs).
    """
    b, T, Cd = x.shape
    w = weight.shape[-1]
    xt = x.transpose(1, 2)
    prev = xt.new_zeros(b, Cd, w - 1) if conv_state is None else conv_state.to(xt.dtype)
    full = torch.cat([prev, xt], dim=-1)
    y = F.conv1d(full, weight[:, None, :].to(xt.dtype), bias.to(xt.dtype), groups=Cd)
    return F.silu(y).transpose(1, 2), full[..., full.shape[-1] - (w - 1):]
