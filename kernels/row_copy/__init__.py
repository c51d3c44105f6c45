"""Row scatter/gather between KV pools: dst[dst_rows[m]] = src[src_rows[m]] (rows of W contiguous values).

dst and src are [rows, W] views of contiguous pools; either may be the pinned host pool. On a GPU
run the Triton kernel moves the rows (host memory read or written through unified addressing, so the
copy can run on a side stream and inside a captured graph); on CPU tensors the reference does.
"""
from __future__ import annotations

import os

import torch

from .ref import copy_rows_ref

__all__ = ["copy_rows", "copy_rows_ref", "resolve_row_copy"]


def resolve_row_copy(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor, src_rows: torch.Tensor,
                     backend: str) -> str:
    """Checks a row copy's operands (shared by copy_rows and kv_resolve's masked fetch_rows); returns the backend
    to run: auto → triton when either side is on CUDA, else ref."""
    if dst.dim() != 2 or src.dim() != 2 or dst.shape[1] != src.shape[1] or dst.dtype != src.dtype:
        raise ValueError(f"dst/src: expected [rows, W] of one W and dtype, got {tuple(dst.shape)} {dst.dtype} / "
                         f"{tuple(src.shape)} {src.dtype}")
    if dst_rows.shape != src_rows.shape or dst_rows.dim() != 1:
        raise ValueError(f"dst_rows/src_rows: expected two [M] tensors, got {tuple(dst_rows.shape)} / "
                         f"{tuple(src_rows.shape)}")
    if not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("dst/src: expected contiguous [rows, W] views")
    cuda = dst.is_cuda or src.is_cuda
    if backend == "auto":
        return "triton" if cuda else "ref"
    if backend == "triton" and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend: 'triton' needs a CUDA run (or TRITON_INTERPRET=1); use 'ref' or 'auto'")
    if backend not in ("triton", "ref"):
        raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")
    return backend


def copy_rows(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor, src_rows: torch.Tensor, *,
              backend: str = "auto") -> None:
    if resolve_row_copy(dst, dst_rows, src, src_rows, backend) == "ref":
        return copy_rows_ref(dst, dst_rows, src, src_rows)
    from .triton_impl import copy_rows_triton
    return copy_rows_triton(dst, dst_rows, src, src_rows)
