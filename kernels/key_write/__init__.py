"""Index keys into the paged fp8 cache: per row, scale = max(amax / 448, 1e-12) (a multiply by the reciprocal)
and codes = fp8(k / scale), stored at (page, offset) — one launch for what the torch path does in ~9 (the learned
indexer writes one key per attention layer and decode step).

keys [pages, bs, d] float8_e4m3fn and scales [pages, bs] fp32 (a layer's cache, contiguous), page / off [M] int,
k [M, d] (any float dtype, last dim contiguous)."""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from .ref import FP8_MAX, quantize_fp8_ref, write_keys_fp8_ref

__all__ = ["FP8_MAX", "quantize_fp8_ref", "write_keys_fp8", "write_keys_fp8_ref"]


def write_keys_fp8(keys: torch.Tensor, scales: torch.Tensor, page: torch.Tensor, off: torch.Tensor, k: torch.Tensor,
                   *, backend: str = "auto") -> None:
    """See the module docstring."""
    if keys.dim() != 3 or keys.dtype != torch.float8_e4m3fn or not keys.is_contiguous():
        raise ValueError(f"keys: expected a contiguous float8_e4m3fn [pages, bs, d], got {keys.dtype} "
                         f"{tuple(keys.shape)}")
    if scales.shape != keys.shape[:2] or scales.dtype != torch.float32 or not scales.is_contiguous():
        raise ValueError(f"scales: expected contiguous float32 {tuple(keys.shape[:2])}, got {scales.dtype} "
                         f"{tuple(scales.shape)}")
    if k.dim() != 2 or k.shape[1] != keys.shape[2] or k.stride(1) != 1:
        raise ValueError(f"k: expected [M, d = {keys.shape[2]}] with a contiguous last dim, got {tuple(k.shape)}")
    if page.shape != (k.shape[0],) or off.shape != (k.shape[0],):
        raise ValueError(f"page/off: expected [M = {k.shape[0]}] each, got {tuple(page.shape)} / {tuple(off.shape)}")
    if pick_backend(backend, k) == "ref":
        return write_keys_fp8_ref(keys, scales, page, off, k)
    from .triton_impl import write_keys_fp8_triton

    return write_keys_fp8_triton(keys, scales, page, off, k)
