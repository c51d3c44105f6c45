"""Scores of a learned DSA-style top-k indexer over its cached keys.

    score[n, t] = scale[t] * sum_j w[n, j] * ReLU(q[n, j] . k[t])

q [N, H, d] (the indexer's query heads of each row), w [N, H] (per-head weights), keys either paged
[P, bs, d] read through each row's page table pages [N, view] (decode: T = view * bs scores per row), or
contiguous [T, d] shared by every row (prefill, pages None); scale [P, bs] / [T] fp32 (fp8 keys' per-token
scale) or None. Keys fp8 e4m3 or bf16 (or fp32). Returns fp32 [N, T].
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import index_scores_ref

__all__ = ["index_scores", "index_scores_ref"]


def _check(q, w, keys, scale, pages) -> None:
    if q.dim() != 3:
        raise ValueError(f"q: expected shape [N, H, d], got {tuple(q.shape)}")
    N, H, D = q.shape
    if tuple(w.shape) != (N, H):
        raise ValueError(f"w: expected shape [N, H] = {(N, H)}, got {tuple(w.shape)}")
    want = 3 if pages is not None else 2
    if keys.dim() != want or keys.shape[-1] != D:
        desc = "[P, bs, d] (paged)" if pages is not None else "[T, d] (contiguous)"
        raise ValueError(f"keys: expected shape {desc} with d={D}, got {tuple(keys.shape)}")
    if scale is not None and tuple(scale.shape) != tuple(keys.shape[:-1]):
        raise ValueError(f"scale: expected shape {tuple(keys.shape[:-1])} (keys without d), got {tuple(scale.shape)}")
    if pages is not None and (pages.dim() != 2 or pages.shape[0] != N):
        raise ValueError(f"pages: expected shape [N, view] = [{N}, view], got {tuple(pages.shape)}")
    for name, t in (("w", w), ("keys", keys), ("scale", scale), ("pages", pages)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (q's), got {t.device}")


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor | None = None,
                 pages: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring. backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref"."""
    _check(q, w, keys, scale, pages)
    if pick_backend(backend, q) == "ref":
        return index_scores_ref(q, w, keys, scale, pages)
    from .triton_impl import index_scores_triton
    return index_scores_triton(q, w, keys, scale, pages)
