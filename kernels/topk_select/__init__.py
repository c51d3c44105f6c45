"""Top-k selection of a sparse-attention indexer: per row, the top min(top_k, pos + 1) positions of [0, pos] by
score, in descending score order, ties to the lower position (exactly a stable descending sort: NaN first,
-0 equal to +0); [N, top_k] int32, -1 past the selection. scores [N, T] fp32, pos [N] (int)."""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import topk_select_ref

__all__ = ["MAX_T", "topk_select", "topk_select_ref"]

MAX_T = 16384  # scores per row the kernel holds in registers (measured faster than the sort up to here)


def topk_select(scores: torch.Tensor, pos: torch.Tensor, top_k: int, *, backend: str = "auto") -> torch.Tensor:
    """See the module docstring. backend: "auto" (Triton on CUDA for rows up to MAX_T scores, the
    reference otherwise) | "triton" | "ref"."""
    if scores.dim() != 2:
        raise ValueError(f"scores: expected shape [N, T], got {tuple(scores.shape)}")
    if pos.shape != (scores.shape[0],):
        raise ValueError(f"pos: expected shape [{scores.shape[0]}] (one per row), got {tuple(pos.shape)}")
    if top_k < 1:
        raise ValueError(f"top_k: expected >= 1, got {top_k}")
    if backend == "auto" and scores.shape[1] > MAX_T:
        backend = "ref"
    if pick_backend(backend, scores) == "ref":
        return topk_select_ref(scores, pos, top_k)
    if scores.shape[1] > MAX_T:
        raise ValueError(f"scores: the kernel holds at most {MAX_T} scores per row, got {scores.shape[1]}; "
                         "use backend='ref' or 'auto'")
    from .triton_impl import topk_select_triton
    return topk_select_triton(scores, pos, top_k)
