"""Torch reference of `sparse_attention`: gather the listed rows, masked softmax, weighted sum (fp32 math).

This is also the CPU path of every top-k KV policy, so it must be deterministic: a row's output
depends only on its query, the values of its listed rows and their order, never on where the rows
sit in the pool (masked entries are zeroed before the math, so whatever a -1 would point at never
leaks in, not even as 0 * NaN).
"""
from __future__ import annotations

import torch


def sparse_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ids: torch.Tensor,
                         scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    N, nq, hd = q.shape
    nkv = k_cache.shape[1]
    valid = ids >= 0                                      # [N, K]
    idx = ids.long().clamp_min(0)
    K = torch.where(valid[..., None, None], k_cache[idx].float(), 0.0)  # [N, K, nkv, hd]
    V = torch.where(valid[..., None, None], v_cache[idx].float(), 0.0)
    qg = q.float().view(N, nkv, nq // nkv, hd)
    s = torch.einsum("ngrd,nkgd->ngrk", qg, K) * scale
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)       # a row with no listed ids attends to nothing: o = 0
    o = torch.einsum("ngrk,nkgd->ngrd", p, V).reshape(N, nq, hd).to(q.dtype)
    if out is not None:
        out.copy_(o)
        return out
    return o
