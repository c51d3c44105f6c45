"""Plain-torch reference of `rope_dtype`: the drafter's rotate-half RoPE as synodic/spec/models/layers.py computes
it, op by op in x's dtype (cos / sin already in that dtype)."""
from __future__ import annotations

import torch


def rope_dtype_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, heads, d]; cos / sin [B, N, d/2] in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, :, None], sin[:, :, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
