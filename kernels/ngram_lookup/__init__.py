"""Prompt lookup over the runner's device token history, one launch per step (the torch composition is ~60 small
launches: a dozen per n-gram length):

    history[rows[b], p_b] = anchors[b]                      p_b = min(positions[b], T - 1)
    m(j) = the longest n <= max_ngram with history[j - i] == history[p_b - i] for i < n   (j < p_b, per row)
    n*   = max_j min(m(j), p_b), kept if n* >= min_ngram
    j*   = the latest j with m(j) >= n*
    hints[b, k] = history[j* + 1 + k] where j* + 1 + k <= p_b, else -1        k < gamma

which is `synodic.spec.ngram.lookup` (the longest suffix that occurred earlier, what followed its latest
occurrence) over the context up to and including the anchor. history [S, T] int64 (S slot rows), rows /
anchors / positions [B] int64; hints [B, gamma] int64.
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import lookup_hints_ref, ngram_hints_ref

__all__ = ["ngram_hints", "ngram_hints_ref", "lookup_hints_ref"]


def ngram_hints(history: torch.Tensor, rows: torch.Tensor, anchors: torch.Tensor, positions: torch.Tensor,
                gamma: int, max_ngram: int, min_ngram: int = 1, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring. Writes the anchors into history."""
    if history.dim() != 2 or history.dtype != torch.long or history.stride(1) != 1:
        raise ValueError(f"history: expected int64 [slots, T] with contiguous rows, got {history.dtype} "
                         f"{tuple(history.shape)} strides {history.stride()}")
    B = rows.shape[0]
    for name, t in (("rows", rows), ("anchors", anchors), ("positions", positions)):
        if t.shape != (B,) or t.dtype != torch.long:
            raise ValueError(f"{name}: expected int64 [B] = ({B},), got {t.dtype} {tuple(t.shape)}")
    if gamma < 1 or not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"gamma / max_ngram / min_ngram: expected gamma >= 1 and 1 <= min_ngram <= max_ngram, got "
                         f"{gamma} / {max_ngram} / {min_ngram}")
    if pick_backend(backend, history) == "ref":
        return ngram_hints_ref(history, rows, anchors, positions, gamma, max_ngram, min_ngram)
    from .triton_impl import ngram_hints_triton
    return ngram_hints_triton(history, rows, anchors, positions, gamma, max_ngram, min_ngram)
