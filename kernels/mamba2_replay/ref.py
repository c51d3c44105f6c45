"""Plain-torch reference of the Mamba-2 ReplaySSM kernels, written row by row from the equations
of docs/replayssm.md in fp32. Same signatures and in-place effects as the public functions.

For one slot with checkpoint S0 and ring entries j = 0..n-1 (x_j, dt_j post-softplus, B_j):
    c_j = A * sum_{i<=j} dt_i
    S_t = e^{c_t} S0 + sum_{j<=t} dt_j e^{c_t - c_j} x_j B_j^T
    y_t = e^{c_t} (S0 C_t) + sum_{j<=t} dt_j e^{c_t - c_j} (B_j . C_t) x_j + D x_t   (* silu(z))
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..replay_common import dequantize, flush_slots, store_state, verify_rows


def _history(ring_x, ring_dt, ring_B, s, n, hpg):
    """Ring entries 0..n-1 of slot s as fp32 [H, n, P], [H, n], [H, n, N] (B repeated per head)."""
    return (ring_x[s, :, :n].float(), ring_dt[s, :, :n].float(),
            ring_B[s, :, :n].float().repeat_interleave(hpg, 0))


def _fold(S0, A, xs, dts, Bs):
    """S after the tokens (xs, dts, Bs) [H, n, ...] starting from S0 [H, P, N] (all fp32)."""
    c = A[:, None] * torch.cumsum(dts, -1)                        # [H, n]
    ct = c[:, -1:] if c.shape[1] else torch.zeros_like(A)[:, None]
    w = dts * torch.exp(ct - c)                                    # [H, n]
    return torch.exp(ct)[..., None] * S0 + torch.einsum("hj,hjp,hjn->hpn", w, xs, Bs)


def _outputs(S0, A, xs, dts, Bs, C_rows, n_hist):
    """y (without D, z) of window tokens r = 0..T-1 sitting at positions n_hist + r of (xs, dts, Bs);
    C_rows [T, H, N]. Output-only route: S0 . C_t plus the weighted ring sum."""
    c = A[:, None] * torch.cumsum(dts, -1)                        # [H, n]
    ys = []
    for r in range(C_rows.shape[0]):
        t = n_hist + r
        ct = c[:, t:t + 1]
        Ct = C_rows[r]                                             # [H, N]
        w = dts[:, :t + 1] * torch.exp(ct - c[:, :t + 1]) * torch.einsum("hjn,hn->hj", Bs[:, :t + 1], Ct)
        ys.append(torch.exp(ct) * torch.einsum("hpn,hn->hp", S0, Ct)
                  + torch.einsum("hj,hjp->hp", w, xs[:, :t + 1]))
    return torch.stack(ys)                                         # [T, H, P]


def _finish(y, x, D, z):
    y = y + D.float()[:, None] * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y


def mamba2_replay_decode_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                             z=None, *, L, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, advance=True):
    b, H, P = x.shape
    G = B.shape[1]
    hpg = H // G
    A, dt_bias = A.float(), dt_bias.float()
    y = torch.zeros(b, H, P, dtype=x.dtype, device=x.device)
    for i in range(b):
        s = int(slot_ids[i])
        if s < 0:
            continue
        wp = int(write_pos[s])
        dtp = F.softplus(dt[i].float() + dt_bias)                                   # [H]
        hx, hdt, hB = _history(ring_x, ring_dt, ring_B, s, wp, hpg)
        xs = torch.cat([hx, x[i].float()[:, None]], 1)
        dts = torch.cat([hdt, dtp[:, None]], 1)
        Bs = torch.cat([hB, B[i].float().repeat_interleave(hpg, 0)[:, None]], 1)
        Ct = C[i].float().repeat_interleave(hpg, 0)                                 # [H, N]
        if wp >= L - 1:  # flush: state route, write the checkpoint (and its low-precision copy)
            St = _fold(dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]), A, xs, dts, Bs)
            store_state(ckpt[s], None if ckpt_scale is None else ckpt_scale[s], St)
            if ckpt_lo is not None:
                store_state(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s], St)
            yv = torch.einsum("hpn,hn->hp", St, Ct)
            new_wp = 0
        else:           # output-only route: read S0 (or its low-precision copy), never write it
            S0 = (dequantize(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s])
                  if ckpt_lo is not None else
                  dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]))
            yv = _outputs(S0, A, xs, dts, Bs, Ct[None], wp)[0]
            ring_x[s, :, wp] = x[i].to(ring_x.dtype)
            ring_dt[s, :, wp] = dtp.to(ring_dt.dtype)
            ring_B[s, :, wp] = B[i].to(ring_B.dtype)
            new_wp = wp + 1
        if advance:
            write_pos[s] = new_wp
        y[i] = _finish(yv, x[i], D, None if z is None else z[i]).to(y.dtype)
    return y


def mamba2_replay_verify_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                             z=None, *, L, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None):
    """Window inputs x [b,T,H,P], dt [b,T,H], B/C [b,T,G,N], z [b,T,H,P] -> y [b,T,H,P]."""
    b, T, H, P = x.shape
    G = B.shape[2]
    hpg = H // G
    A, dt_bias = A.float(), dt_bias.float()
    y = torch.zeros(b, T, H, P, dtype=x.dtype, device=x.device)
    for i, s, wp in verify_rows(slot_ids, write_pos, T, L):
        dtp = F.softplus(dt[i].float() + dt_bias)                                   # [T, H]
        hx, hdt, hB = _history(ring_x, ring_dt, ring_B, s, wp, hpg)
        xs = torch.cat([hx, x[i].float().transpose(0, 1)], 1)                       # [H, wp+T, P]
        dts = torch.cat([hdt, dtp.transpose(0, 1)], 1)
        Bs = torch.cat([hB, B[i].float().repeat_interleave(hpg, 1).transpose(0, 1)], 1)
        S0 = (dequantize(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s])
              if ckpt_lo is not None else
              dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]))
        yv = _outputs(S0, A, xs, dts, Bs, C[i].float().repeat_interleave(hpg, 1), wp)  # [T, H, P]
        for r in range(T):
            y[i, r] = _finish(yv[r], x[i, r], D, None if z is None else z[i, r]).to(y.dtype)
        ring_x[s, :, wp:wp + T] = x[i].transpose(0, 1).to(ring_x.dtype)
        ring_dt[s, :, wp:wp + T] = dtp.transpose(0, 1).to(ring_dt.dtype)
        ring_B[s, :, wp:wp + T] = B[i].transpose(0, 1).to(ring_B.dtype)
    return y


def mamba2_replay_flush_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, A, slot_ids, *, L, min_room=None,
                            ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None, advance=True):
    """Fold ring[:write_pos] into the checkpoint where write_pos > 0 and (min_room is None or
    write_pos + min_room > L)."""
    H = ckpt.shape[1]
    hpg = H // ring_B.shape[1]
    A = A.float()
    for s, wp in flush_slots(slot_ids, write_pos, L, min_room):
        St = _fold(dequantize(ckpt[s], None if ckpt_scale is None else ckpt_scale[s]), A,
                   *_history(ring_x, ring_dt, ring_B, s, wp, hpg))
        store_state(ckpt[s], None if ckpt_scale is None else ckpt_scale[s], St)
        if ckpt_lo is not None:
            store_state(ckpt_lo[s], None if ckpt_lo_scale is None else ckpt_lo_scale[s], St)
        if advance:
            write_pos[s] = 0
