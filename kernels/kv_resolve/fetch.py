"""Masked row fetch of a verify window's shared retrieval: dst[dst_rows[m]] = src[src_rows[m]] where
src_rows[m] >= 0; entries with src_rows[m] < 0 load and store nothing.

A window's misses sit at fixed-width, mostly empty positions (the union of T queries' top-k, padded), so a
plain row copy would move a padding row for every empty entry; masked lanes here touch no memory, so host
traffic is exactly the missed rows. src is the pinned host pool on a GPU run (read through unified addressing),
dst the device staging rows; fixed shapes and no host sync, so the fetch is captured with the step.
"""
from __future__ import annotations

import torch
from synodic.kernels.row_copy import resolve_row_copy


def fetch_rows_ref(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor, src_rows: torch.Tensor) -> None:
    m = src_rows >= 0
    d, s = dst_rows[m].long(), src_rows[m].long()
    dst[d.to(dst.device)] = src[s.to(src.device)].to(dst.device)


def fetch_rows(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor, src_rows: torch.Tensor, *,
               backend: str = "auto") -> None:
    """dst, src: [rows, W] contiguous views of one dtype; dst_rows, src_rows: [M] int. backend: auto (Triton
    when either side is on CUDA, else the reference) | triton | ref."""
    if resolve_row_copy(dst, dst_rows, src, src_rows, backend) == "ref":
        return fetch_rows_ref(dst, dst_rows, src, src_rows)
    return _fetch_triton(dst, dst_rows, src, src_rows)


def _fetch_triton(dst, dst_rows, src, src_rows, block_m: int = 8, num_warps: int = 4) -> None:
    import triton

    from .fetch_triton import fetch_rows_kernel
    M, W = dst_rows.shape[0], dst.shape[-1]
    if M == 0:
        return
    block_w = min(1024, triton.next_power_of_2(W))
    fetch_rows_kernel[(triton.cdiv(M, block_m), triton.cdiv(W, block_w))](
        dst, dst_rows, src, src_rows, M, W, BLOCK_M=block_m, BLOCK_W=block_w, num_warps=num_warps)
