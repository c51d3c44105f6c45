"""Torch reference of `index_scores` (fp32 math, the same order of operations as the kernel)."""
from __future__ import annotations

import torch


def gather_keys(keys: torch.Tensor, scale: torch.Tensor | None, pages: torch.Tensor | None):
    """Paged keys [P, bs, d] through pages [N, view] → [N, view * bs, d] (+ scale [N, view * bs]); contiguous
    keys [T, d] (pages None) → [1, T, d] shared by every row."""
    if pages is None:
        return keys[None], (None if scale is None else scale[None])
    k = keys[pages.long()].flatten(1, 2)
    return k, (None if scale is None else scale[pages.long()].flatten(1, 2))


def index_scores_ref(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor | None,
                     pages: torch.Tensor | None = None) -> torch.Tensor:
    """score[n, t] = scale[t] * sum_j w[n, j] * ReLU(q[n, j] . k[t]) in fp32 → [N, T]."""
    k, s = gather_keys(keys, scale, pages)
    dots = torch.einsum("nhd,ntd->nht", q.float(), k.float().expand(q.shape[0], -1, -1))
    out = (dots.relu() * w.float()[:, :, None]).sum(1)
    return out if s is None else out * s
