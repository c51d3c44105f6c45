"""Top-k selection of a sparse-attention indexer: per row, the top min(top_k, pos + 1) positions of [0, pos] by
score, in descending score order, ties to the lower position (exactly a stable descending sort: NaN first,
-0 equal to +0); [N, top_k] int32, -1 past the selection. scores [N, T] fp32, pos [N] (int)."""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import topk_select_ref

__all__ = ["topk_select", "topk_select_ref"]


def topk_select(scores: torch.Tensor, pos: torch.Tensor, top_k: int, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring. backend: "auto" (Triton on CUDA, the reference otherwise) | "triton" | "ref".
    The Triton path takes rows of any length: each row split over many programs for a few rows or long rows,
    one program per row otherwise (`triton_impl.SPLIT_ROWS`, `SPLIT_T`)."""
    if scores.dim() != 2:
        raise ValueError(f"scores: expected shape [N, T], got {tuple(scores.shape)}")
    if pos.shape != (scores.shape[0],):
        raise ValueError(f"pos: expected shape [{scores.shape[0]}] (one per row), got {tuple(pos.shape)}")
    if top_k < 1:
        raise ValueError(f"top_k: expected >= 1, got {top_k}")
    if pick_backend(backend, scores) == "ref":
        return topk_select_ref(scores, pos, top_k)
    from .triton_impl import topk_select_triton
    return topk_select_triton(scores, pos, top_k)
