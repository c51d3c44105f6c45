"""The draft model's context K/V ring counted in the KV policy's device budget (`kv=adaptive`).

A neural drafter keeps `context_window` rotated context rows per request slot and draft layer on the device,
allocated once at build and independent of context length. The adaptive policy sizes residency by its device
pool, so memory the ring holds must come out of that pool: the graph hands the ring's bytes to the policy once
the drafter is built, and the policy withholds as many pages as they fill (`kv.drafter_ring_in_budget=true`).
"""
from __future__ import annotations

import torch


def drafter_ring_bytes(spec) -> int:
    """Device bytes of a built drafter's context ring (every tensor of it); 0 for drafters without one."""
    ring = getattr(getattr(spec, "model", None), "_ring", None)
    if not isinstance(ring, dict):
        return 0
    seen = {}  # storage -> bytes: the per-layer "k" / "v" entries are views of one tensor
    for v in ring.values():
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def count_drafter_ring(graph) -> None:
    """Graph build hook: the KV policy that budgets device memory (`reserve_device_bytes`) is told the ring."""
    reserve = getattr(graph.kv, "reserve_device_bytes", None)
    if not getattr(getattr(graph.kv, "cfg", None), "drafter_ring_in_budget", False):
        return
    n = drafter_ring_bytes(graph.spec)
    if reserve is not None and n:
        reserve(n, "the draft model's context ring")
