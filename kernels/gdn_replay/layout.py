"""Memory layout of a GDN replay checkpoint. Logically every checkpoint is [slots, HV, V, K] (the eager state's
indexing: torch references, seeding and tests index it so); per head it is stored either row-major [V, K] (K
contiguous, the default) or "KV-major" [K, V] (V contiguous: `gdn_replay_alloc(kv_major=True)` returns the
[slots, HV, K, V] storage as its transposed view). Every GDN replay kernel reads both; KV-major tiles put the
lanes of a warp along V, so the K-axis reductions of a step stay inside a thread instead of five shuffle levels
per row (an offline sm_90 compile of those reductions: 16 instead of 320 shuffles per [32, 128] tile)."""
from __future__ import annotations

import torch


def _major(t: torch.Tensor, name: str) -> bool:
    if t.is_contiguous():
        return False
    if t.transpose(-1, -2).is_contiguous():
        return True
    raise ValueError(f"{name}: expected a contiguous [slots, HV, V, K] tensor or the transposed view of a contiguous "
                     f"[slots, HV, K, V] one (gdn_replay_alloc(kv_major=True)), got shape {tuple(t.shape)} "
                     f"strides {tuple(t.stride())}")


def kv_major(ckpt: torch.Tensor, ckpt_lo: torch.Tensor | None = None) -> bool:
    """Whether the checkpoint (and its low-precision copy, which must match) is stored [K, V] per head; raises for
    any other layout (the Triton launchers' check)."""
    major = _major(ckpt, "ckpt")
    if ckpt_lo is not None and _major(ckpt_lo, "ckpt_lo") != major:
        raise ValueError("ckpt_lo: expected the checkpoint's layout (both [V, K] or both [K, V] per head)")
    return major
