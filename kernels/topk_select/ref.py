"""Torch reference of `topk_select`: a stable descending sort (the selection `KeyIndexer.select` always made)."""
from __future__ import annotations

import torch


def topk_select_ref(scores: torch.Tensor, pos: torch.Tensor, top_k: int) -> torch.Tensor:
    """Top min(top_k, pos+1) of positions [0, pos] per row by score, ties to the lower position (NaN above
    +inf, -0 equal to +0: torch's sort order); [N, top_k] int32, -1 past the selection."""
    N, T = scores.shape
    t = torch.arange(T, device=scores.device)
    s = scores.masked_fill(t[None, :] > pos[:, None], float("-inf"))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :top_k]
    if order.shape[1] < top_k:
        order = torch.cat([order, order.new_zeros(N, top_k - order.shape[1])], 1)
    rank = torch.arange(top_k, device=scores.device)
    # a row has at most T positions: past them the padding is no selection, also when pos >= T
    return torch.where(rank[None, :] <= pos.clamp(max=T - 1)[:, None], order, -1).to(torch.int32)
