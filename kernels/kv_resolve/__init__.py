"""Fused per-layer resolve of top-k positions to physical device rows (HiSparse / adaptive KV).

For each request row n of the batch (slot r = rows[n], newest position P = pos[n]) and each selected
position p = sel[n, j] (top-k order, -1 = none), in priority order:

1. `res_table[r, p // bs] >= 0` (adaptive: the page is resident) → that page's row;
2. fast path (`fast_path` and P < B, hisparse): hot slot p (short sequences fill slots in order);
3. p == P → the reserved newest-token slot B;
4. `slot_of[p] >= 0` (hit) → that hot slot;
5. miss → the least recently used hot slot not hit this step; the row is copied src → device.

Hot slot s of slot r is device row `hot_table[r, s // bs] * bs + s % bs`; per layer the state is
`hot_pos[r, s]` (position held, slot B = newest), `lru[r]` (slot order, least recent first) and the
reverse map `slot_of` (per token, paged by `idx_table` like the indexer keys). After the call hits and
misses sit at the MRU end of `lru` in top-k order. Returns (ids [N, K] int32 in top-k order, n_miss [N]).

Shapes: sel [N, K] int; rows, pos [N] int64; res_table [S, MP] int32 or None; hot_table [S, ≥ B//bs+1]
int32; hot_pos [S, B+1] int32; lru [S, B] int32; idx_table [S, MIP] int32; slot_of [IP, bs] int32;
src_table [S, MP] int32; src [SP, bs, W]; dev [DP, bs, W] (rows contiguous, same dtype).
Needs K <= B. Slots of distinct rows must be distinct, except rows that take the fast path or
resolve only resident pages (padding rows).
"""
from __future__ import annotations

import os

import torch

from .ref import kv_resolve_ref

__all__ = ["kv_resolve", "kv_resolve_ref"]


def _check(sel, rows, pos, hot_pos, lru, slot_of, src, dev, block_size) -> None:
    N, K = sel.shape
    S, B = lru.shape
    if K > B:
        raise ValueError(f"sel: expected at most B={B} positions per row (hot buffer size), got K={K}")
    if tuple(hot_pos.shape) != (S, B + 1):
        raise ValueError(f"hot_pos: expected shape [S, B+1] = [{S}, {B + 1}], got {tuple(hot_pos.shape)}")
    if tuple(rows.shape) != (N,) or tuple(pos.shape) != (N,):
        raise ValueError(f"rows, pos: expected shape [N] = [{N}], got {tuple(rows.shape)}, {tuple(pos.shape)}")
    if slot_of.dim() != 2 or slot_of.shape[1] != block_size or slot_of.dtype != torch.int32:
        raise ValueError(f"slot_of: expected int32 [pages, {block_size}], got {slot_of.dtype} {tuple(slot_of.shape)}")
    if src.shape[1:] != dev.shape[1:] or dev.shape[1] != block_size or src.dtype != dev.dtype:
        raise ValueError(f"src/dev: expected [pages, {block_size}, W] of one dtype, got {tuple(src.shape)} "
                         f"{src.dtype} / {tuple(dev.shape)} {dev.dtype}")
    if not (src.is_contiguous() and dev.is_contiguous()):
        raise ValueError("src/dev: expected contiguous pools (one row = W contiguous values)")


def kv_resolve(sel, rows, pos, *, res_table, hot_table, hot_pos, lru, idx_table, slot_of, src_table, src, dev,
               block_size: int, fast_path: bool, ids=None, n_miss=None, scratch=None, backend: str = "auto",
               config: dict | None = None):
    """See the module docstring. backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    `scratch` (triton only): a `triton_impl.ResolveScratch` reused across calls (fixed addresses).
    `config` (triton only): launch overrides, keys of `triton_impl.CONFIG_KEYS`
    (`python -m benchmarks.kv_resolve` sweeps them)."""
    _check(sel, rows, pos, hot_pos, lru, slot_of, src, dev, block_size)
    if backend == "auto":
        backend = "triton" if sel.is_cuda else "ref"
    args = (sel, rows, pos, res_table, hot_table, hot_pos, lru, idx_table, slot_of, src_table, src, dev,
            block_size, fast_path)
    if backend == "ref":
        return kv_resolve_ref(*args, ids=ids, n_miss=n_miss)
    if backend == "triton":
        if not sel.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("backend: 'triton' needs CUDA tensors (or TRITON_INTERPRET=1); use 'ref' or 'auto'")
        from .triton_impl import CONFIG_KEYS, kv_resolve_triton
        bad = sorted(set(config or {}) - set(CONFIG_KEYS))
        if bad:
            raise ValueError(f"config: unknown key(s) {bad}; expected some of {list(CONFIG_KEYS)}")
        return kv_resolve_triton(*args, ids=ids, n_miss=n_miss, scratch=scratch, **(config or {}))
    raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")
