"""Eager speculative-verify window for Gated DeltaNet (the baseline: what vLLM does today).

A verify step runs the recurrence over a window of T = 1 + drafts tokens per sequence and writes
one full state per window position into a state slot, so the next step can start from the state
of the last accepted position (a request owns 1 + drafts slots). Per row b and position t:

    S_{-1} = state[src_ids[b]]                               (read once)
    S = exp(g_t) * S ;  u = beta_t * (v_t - S k_t) ;  S_t = S + u k_tᵀ ;  o_t = S_t q_t
    state[dst_ids[b, t]] = S_t

with q, k L2-normalised (optional) and q scaled, fp32 math. Each position equals one `gdn_decode`
step applied to the previous position's *stored* state (S_t is rounded to the state dtype before
it is carried on), so for any accepted prefix the states and outputs are the same as
non-speculative decoding, also for a bf16 state. With T = 1 and dst = src this is exactly
`gdn_decode`.
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import gdn_decode_window_ref

__all__ = ["gdn_decode_window", "gdn_decode_window_ref"]

_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT = (torch.int32, torch.int64)



def _check(state, q, k, v, g, beta, src_ids, dst_ids, out) -> None:
    if state.dim() != 4:
        raise ValueError(f"state: expected shape [num_slots, HV, V, K], got {tuple(state.shape)}")
    if state.dtype not in _STATE_DTYPES:
        raise ValueError(f"state: expected dtype float32 or bfloat16, got {state.dtype}")
    _, HV, V, K = state.shape
    if v.dim() != 4 or v.shape[1] == 0:
        raise ValueError(f"v: expected shape [batch, T, HV, V] = [batch, T, {HV}, {V}] with T >= 1, "
                         f"got {tuple(v.shape)}")
    batch, T = v.shape[:2]
    expect_shape("v", v, (batch, T, HV, V), "[batch, T, HV, V]")
    if q.dim() != 4 or q.shape[2] == 0 or HV % q.shape[2]:
        raise ValueError(f"q: expected shape [batch, T, Hk, K] = [{batch}, {T}, Hk, {K}] with HV={HV} "
                         f"divisible by Hk, got {tuple(q.shape)}")
    Hk = q.shape[2]
    expect_shape("q", q, (batch, T, Hk, K), "[batch, T, Hk, K]")
    expect_shape("k", k, (batch, T, Hk, K), "[batch, T, Hk, K]")
    expect_shape("g", g, (batch, T, HV), "[batch, T, HV]")
    expect_shape("beta", beta, (batch, T, HV), "[batch, T, HV]")
    expect_shape("src_ids", src_ids, (batch,), "[batch]")
    expect_shape("dst_ids", dst_ids, (batch, T), "[batch, T]")
    for name, t in (("src_ids", src_ids), ("dst_ids", dst_ids)):
        if t.dtype not in _INT:
            raise ValueError(f"{name}: expected dtype int32 or int64, got {t.dtype}")
    if out is not None:
        expect_shape("out", out, (batch, T, HV, V), "[batch, T, HV, V]")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("src_ids", src_ids),
                    ("dst_ids", dst_ids), ("out", out)):
        if t is not None and t.device != state.device:
            raise ValueError(f"{name}: expected device {state.device} (the state's), got {t.device}")


def gdn_decode_window(state, q, k, v, g, beta, src_ids, dst_ids, *, scale=None, use_qk_l2norm=True,
                      out=None, backend="auto"):
    """Eager verify of a T-token window; returns o [batch, T, HV, V] in v.dtype (or writes `out`).

    state [num_slots, HV, V, K] fp32/bf16 (K contiguous); q, k [batch, T, Hk, K]; v [batch, T, HV, V]
    (value head h uses q/k head h // (HV // Hk)); g [batch, T, HV] log decay; beta [batch, T, HV]
    (already sigmoid-ed); scale defaults to K ** -0.5.
    src_ids [batch]: slot each row starts from; negative = padding row (no state read or write,
    o rows 0). dst_ids [batch, T]: slot receiving S_t; a negative entry skips that store (o_t is
    still computed). The source tile is loaded before any store, so dst_ids[b, t] may equal
    src_ids[b] (e.g. t = 0 reusing the source slot). Non-negative dst slots must be distinct over
    the whole batch and must not be another row's source slot.
    backend: "auto" (Triton on CUDA, reference otherwise) | "triton" | "ref".
    """
    _check(state, q, k, v, g, beta, src_ids, dst_ids, out)
    if pick_backend(backend, state) == "ref":
        return gdn_decode_window_ref(state, q, k, v, g, beta, src_ids, dst_ids, scale, use_qk_l2norm, out)
    from .triton_impl import gdn_decode_window_triton

    return gdn_decode_window_triton(state, q, k, v, g, beta, src_ids, dst_ids, scale, use_qk_l2norm, out)
