"""Sparse attention over per-(request, query) lists of physical row ids.

    o[n] = softmax(q[n] · K[ids[n]]ᵀ · scale) · V[ids[n]]      (ids < 0 masked, GQA heads)

The KV policy decides where rows live (a resident page, a hot-buffer slot, a freshly fetched row);
this op only reads the rows it is told to, in the order it is told, so every placement of the same
rows gives the same output.
"""
from __future__ import annotations

import math
import os

import torch

from .ref import sparse_attention_ref

__all__ = ["sparse_attention", "sparse_attention_ref"]


def _check(q, k_cache, v_cache, ids, out) -> None:
    if q.dim() != 3:
        raise ValueError(f"q: expected shape [N, nq, hd], got {tuple(q.shape)}")
    N, nq, hd = q.shape
    if k_cache.dim() != 3 or k_cache.shape[2] != hd or nq % k_cache.shape[1]:
        raise ValueError(f"k_cache: expected shape [rows, nkv, {hd}] with nq={nq} divisible by nkv, "
                         f"got {tuple(k_cache.shape)}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (k_cache's), got {tuple(v_cache.shape)}")
    if ids.dim() != 2 or ids.shape[0] != N:
        raise ValueError(f"ids: expected shape [N, K] = [{N}, K], got {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids: expected dtype int32 or int64, got {ids.dtype}")
    if out is not None and tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out: expected shape {tuple(q.shape)}, got {tuple(out.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("ids", ids), ("out", out)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (q's), got {t.device}")


def sparse_attention(q, k_cache, v_cache, ids, *, scale: float | None = None, out=None, backend: str = "auto"):
    """q [N, nq, hd]; k_cache, v_cache [rows, nkv, hd] (strided views welcome, e.g. kv[:, 0] of a
    [rows, 2, nkv, hd] pool); ids [N, K] int32/int64 row ids, -1 = masked. Query head h reads KV head
    h // (nq // nkv). Returns o [N, nq, hd] in q.dtype (a row whose ids are all -1 gets zeros).
    scale defaults to hd ** -0.5. backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    """
    _check(q, k_cache, v_cache, ids, out)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend == "auto":
        backend = "triton" if q.is_cuda else "ref"
    if backend == "ref":
        return sparse_attention_ref(q, k_cache, v_cache, ids, scale, out)
    if backend == "triton":
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("backend: 'triton' needs CUDA tensors (or TRITON_INTERPRET=1); use 'ref' or 'auto'")
        from .triton_impl import sparse_attention_triton
        return sparse_attention_triton(q, k_cache, v_cache, ids, scale, out)
    raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")
