"""Eager Gated DeltaNet decode step: flash-linear-attention's fused recurrent gated delta rule,
one token.

    S = exp(g) * S ;  u = beta * (v - S k) ;  S = S + u kᵀ ;  o = S q
with q, k L2-normalised (optional) and q scaled, fp32 math, the state updated in place at
`slot_ids`.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import gdn_decode_ref

__all__ = ["gdn_decode", "gdn_decode_ref"]

_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)



def _check(state, q, k, v, g, beta, slot_ids, out) -> None:
    if state.dim() != 4:
        raise ValueError(f"state: expected shape [num_slots, HV, V, K], got {tuple(state.shape)}")
    if state.dtype not in _STATE_DTYPES:
        raise ValueError(f"state: expected dtype float32 or bfloat16, got {state.dtype}")
    _, HV, V, K = state.shape
    if v.dim() != 3:
        raise ValueError(f"v: expected shape [batch, HV, V] = [batch, {HV}, {V}], got {tuple(v.shape)}")
    batch = v.shape[0]
    expect_shape("v", v, (batch, HV, V), "[batch, HV, V]")
    if q.dim() != 3 or q.shape[1] == 0 or HV % q.shape[1]:
        raise ValueError(f"q: expected shape [batch, Hk, K] = [{batch}, Hk, {K}] with HV={HV} divisible "
                         f"by Hk, got {tuple(q.shape)}")
    Hk = q.shape[1]
    expect_shape("q", q, (batch, Hk, K), "[batch, Hk, K]")
    expect_shape("k", k, (batch, Hk, K), "[batch, Hk, K]")
    expect_shape("g", g, (batch, HV), "[batch, HV]")
    expect_shape("beta", beta, (batch, HV), "[batch, HV]")
    expect_shape("slot_ids", slot_ids, (batch,), "[batch]")
    if slot_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_ids: expected dtype int32 or int64, got {slot_ids.dtype}")
    if out is not None:
        expect_shape("out", out, (batch, HV, V), "[batch, HV, V]")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("slot_ids", slot_ids),
                    ("out", out)):
        if t is not None and t.device != state.device:
            raise ValueError(f"{name}: expected device {state.device} (the state's), got {t.device}")


def gdn_decode(state, q, k, v, g, beta, slot_ids, *, scale=None, use_qk_l2norm=True, out=None,
               backend="auto"):
    """One Gated DeltaNet decode step; returns o [batch, HV, V] in v.dtype (or writes `out`).

    state [num_slots, HV, V, K] fp32/bf16 (K contiguous), rows `slot_ids` updated in place
    (negative id: padding row, no state read/write, o row = 0); q, k [batch, Hk, K]; v [batch, HV, V]
    (value head h uses q/k head h // (HV // Hk)); g [batch, HV] log decay; beta [batch, HV]
    (already sigmoid-ed); scale defaults to K ** -0.5.
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    Slot ids must be distinct among non-negative entries.
    """
    _check(state, q, k, v, g, beta, slot_ids, out)
    if pick_backend(backend, state) == "ref":
        return gdn_decode_ref(state, q, k, v, g, beta, slot_ids, scale, use_qk_l2norm, out)
    from .triton_impl import gdn_decode_triton

    return gdn_decode_triton(state, q, k, v, g, beta, slot_ids, scale, use_qk_l2norm, out)
