"""Mamba-2 ReplaySSM state backend kernels: cache the SSM inputs, not the state.

Per slot and SSM layer the caller owns (see ``mamba2_replay_alloc``):
  ckpt      [slots, H, P, N]  checkpoint S0, same layout as the eager state (fp32 reference;
                              bf16 / fp8-e4m3 + ``ckpt_scale`` [slots, H, P] for single precision)
  ring_x    [slots, H, L, P]  model dtype         ring_dt [slots, H, L] fp32 (post bias+softplus)
  ring_B    [slots, G, L, N]  model dtype         write_pos [slots] int32
  ckpt_lo   optional low-precision copy for dual precision: bf16, or fp8 e4m3 + ``ckpt_lo_scale``
            [slots, H, P] fp32 (one scale per (head, p) row over N).

Cursor contract (``write_pos[s]`` = committed tokens cached since the checkpoint, 0 <= wp <= L):
  * decode: the token goes to ring position wp. If wp >= L-1 the step flushes (state route: S_t is
    rebuilt from ckpt + ring + this token, written to ckpt and ckpt_lo, wp <- 0; the token is not
    cached). Otherwise the output-only route reads ckpt_lo if given, else ckpt, never writes
    it, and wp <- wp+1. So with plain decoding wp = step mod L.
  * speculative window of T tokens: first ``mamba2_replay_flush(..., min_room=T)`` (flushes the
    slots with wp + T > L — the design's "write_pos + 2T > L + T" — so a window never straddles a
    flush; a flush folds only committed tokens), then ``mamba2_replay_verify`` (T outputs, window
    entries written to ring[wp : wp+T], wp unchanged, no state written), then
    ``replay_commit(write_pos, accepted, slot_ids)`` (wp += accepted; no host sync).
  * rows with a negative slot id are skipped (output rows zero).
  * ``advance=False`` leaves write_pos alone, for callers that share one cursor across layers and
    move it once per step with ``replay_advance`` / ``replay_flush_reset``.
Single-precision fp8 checkpoint: each flush dequantises S0 (per-row scales), folds the ring in
fp32 and requantises with fresh per-row scales (amax / 448).
"""
from __future__ import annotations

import torch

from .. import replay_common as rc
from .._dispatch import pick_backend
from ..replay_common import LaunchPlan, is_fp8, replay_advance, replay_commit, replay_flush_reset
from .ref import mamba2_replay_decode_ref, mamba2_replay_flush_ref, mamba2_replay_verify_ref

__all__ = ["mamba2_replay_decode", "mamba2_replay_verify", "mamba2_replay_flush", "mamba2_replay_alloc",
           "LaunchPlan", "replay_commit", "replay_advance", "replay_flush_reset"]



def _check_cache(ckpt, ring_x, ring_dt, ring_B, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale):
    slots, H, P, N = ckpt.shape
    G = ring_B.shape[1]
    if H % G:
        raise ValueError(f"H={H} is not a multiple of G={G}")
    want = {"ring_x": (ring_x, (slots, H, L, P)), "ring_dt": (ring_dt, (slots, H, L)),
            "ring_B": (ring_B, (slots, G, L, N)), "write_pos": (write_pos, (slots,))}
    rc.check_ring(want, write_pos, L, ("ring_dt", ring_dt))
    rc.check_state_pair(ckpt, ckpt_scale, "ckpt", ckpt.shape)
    rc.check_state_pair(ckpt_lo, ckpt_lo_scale, "ckpt_lo", ckpt.shape)
    return slots, H, P, N, G


def _inner(t):
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


VERIFY_IMPLS = ("auto", "group", "head_group", "per_head")


# batch x heads from which "auto" verifies an fp32 checkpoint with the per-group kernel: 1.13-1.14x the per-head
# kernel at batch 128 and 256 of nemotron_h_8b's 128 heads, slower at batch 32; equal with a low-precision copy
# (docs/tuning/replay.md)
GROUP_MIN_ROWS = 16384


def _verify_impl(impl: str, rows: int = 0, ckpt=None, ckpt_lo=None, config=None) -> str:
    if impl not in VERIFY_IMPLS:
        raise ValueError(f"impl: expected one of {VERIFY_IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    fp32 = ckpt is not None and ckpt.dtype == torch.float32 and ckpt_lo is None
    # a config given with "auto" is a per-head one (the documented default impl)
    return "group" if fp32 and config is None and rows >= GROUP_MIN_ROWS else "per_head"


def mamba2_replay_decode(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                         z=None, *, L: int, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None,
                         advance: bool = True, backend: str = "auto",
                         row_wp=None, plan: LaunchPlan | None = None) -> torch.Tensor:
    """One decode step per row: x [b,H,P], dt [b,H] raw, B/C [b,G,N], z [b,H,P] or None,
    A/D/dt_bias [H], slot_ids [b] -> y [b,H,P] (x dtype), equal to eager ``mamba2_decode``
    (dt = softplus(dt + dt_bias); y = S.C + D x, times silu(z) when z is given).
    ``impl="per_head"`` (Triton) is the eager-shaped kernel of ``decode`` (config = (BLOCK_P, warps));
    it only reads the cursor, so it needs ``advance=False``. Same semantics as "head_group", which moves the
    cursor itself (atomic ticket). "auto": per-head when ``advance=False`` (the engine's mode; 1.78x the eager
    kernel at batch 256 vs head-group's 1.13x on the H200), else head-group. ``split`` (per-head): one fused launch
    (False) or an
    output-only launch plus a flush launch (True, launch config ``flush_config``); None =
    ``decode.split_default``. ``row_wp`` (per-head, optional): write_pos[slot_ids] as int32 [b], gathered once
    per step by the caller; lets a split step's output-only launch skip flushing rows without waiting.
    ``ring_dots`` (per-head, split): the group's B . C products from a prologue launch; None =
    ``replay_common.ring_dots_default``. ``overlap`` (per-head, split): the flush launch on a side stream beside the
    output-only launch; None = ``replay_common.overlap_default``."""
    p = plan or LaunchPlan()
    config, impl, split, flush_config = p.config, p.impl, p.split, p.flush_config
    ring_by_cursor, ring_dots, overlap = p.ring_by_cursor, p.ring_dots, p.overlap
    if impl not in ("auto", "head_group", "per_head"):
        raise ValueError(f"impl: expected 'auto', 'head_group' or 'per_head', got {impl!r}")
    if impl == "auto":
        impl = "head_group" if advance else "per_head"
    if impl == "per_head" and advance:
        raise ValueError("impl='per_head' never moves write_pos: call it with advance=False (then replay_advance)")
    _check_cache(ckpt, ring_x, ring_dt, ring_B, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    if pick_backend(backend, ckpt) == "ref":
        return mamba2_replay_decode_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias,
                                        slot_ids, z, L=L, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                        ckpt_lo_scale=ckpt_lo_scale, advance=advance)
    if impl == "per_head":
        from .decode import launch_decode
        x, B, C, z = _inner(x), _inner(B), _inner(C), _inner(z)
        return launch_decode(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                                z, torch.empty_like(x), L=L, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                ckpt_lo_scale=ckpt_lo_scale, config=config, split=split, flush_config=flush_config,
                                row_wp=row_wp, ring_by_cursor=ring_by_cursor, ring_dots=ring_dots,
                                overlap=overlap)
    from .head_group import MODE_DECODE, launch
    x, B, C, z = _inner(x), _inner(B), _inner(C), _inner(z)
    y = torch.empty_like(x)
    # decode = verify-shaped launch with T = 1: give the inputs a unit window axis
    launch(MODE_DECODE, ckpt, ring_x, ring_dt, ring_B, write_pos, x.unsqueeze(1), dt.unsqueeze(1), A,
           B.unsqueeze(1), C.unsqueeze(1), D, dt_bias, slot_ids, None if z is None else z.unsqueeze(1),
           y.unsqueeze(1), L=L, T=1, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale,
           advance=advance, config=config)
    return y


def mamba2_replay_verify(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                         z=None, *, L: int, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None,
                         backend: str = "auto", plan: LaunchPlan | None = None) -> torch.Tensor:
    """Outputs of a speculative window: x [b,T,H,P], dt [b,T,H], B/C [b,T,G,N], z [b,T,H,P] ->
    y [b,T,H,P], from (ckpt or ckpt_lo, ring[:write_pos], window). Writes the window's entries at
    ring[write_pos : write_pos+T] (caller guarantees write_pos + T <= L); write_pos and the
    checkpoint are not touched. Follow with ``replay_commit``.
    ``impl`` (Triton): "per_head" = the eager-shaped kernels of ``verify`` (one head per program, state
    tile read once, ring loaded without waiting for the cursor, group-level B.C products in a prologue
    kernel at larger batches; config = (BLOCK_P, num_warps[, gram[, maxnreg]])), "head_group" = the
    ``head_group`` kernel (config = (BLOCK_P, heads per program, num_warps[, maxnreg])), "group" = ``verify_group``
    (one program per (row, group), looping over the group's heads; config = (num_warps, num_stages[, head
    splits])); "auto" = per-group for an fp32 checkpoint from ``GROUP_MIN_ROWS`` batch x heads (config None),
    else per-head."""
    p = plan or LaunchPlan()
    config, impl = p.config, p.impl
    impl = _verify_impl(impl, x.shape[0] * ckpt.shape[1], ckpt, ckpt_lo, config)
    _check_cache(ckpt, ring_x, ring_dt, ring_B, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    T = x.shape[1]
    if T > L:
        raise ValueError(f"window T={T} exceeds the ring L={L}")
    if pick_backend(backend, ckpt) == "ref":
        return mamba2_replay_verify_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias,
                                        slot_ids, z, L=L, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                        ckpt_lo_scale=ckpt_lo_scale)
    x, B, C, z = _inner(x), _inner(B), _inner(C), _inner(z)
    y = torch.empty_like(x)
    if impl == "group":
        from .verify_group import launch_verify_group
        return launch_verify_group(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids,
                                   z, y, L=L, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale,
                                   config=config)
    if impl == "per_head":
        from .verify import launch_verify
        return launch_verify(ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z,
                                y, L=L, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale,
                                config=config)
    from .head_group import MODE_VERIFY, launch
    launch(MODE_VERIFY, ckpt, ring_x, ring_dt, ring_B, write_pos, x, dt, A, B, C, D, dt_bias, slot_ids, z, y,
           L=L, T=T, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale, advance=False,
           config=config)
    return y


def mamba2_replay_flush(ckpt, ring_x, ring_dt, ring_B, write_pos, A, slot_ids, *, L: int,
                        min_room: int | None = None, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None,
                        advance: bool = True,
                        backend: str = "auto", plan: LaunchPlan | None = None) -> None:
    """Fold ring[:write_pos] into the checkpoint (state route) for the rows' slots where
    write_pos > 0 and (min_room is None, or write_pos + min_room > L); refresh ckpt_lo; reset
    write_pos to 0 there. Decided on the device (no host sync). Before a window of T tokens call
    with min_room=T; min_room=None folds every non-empty ring (e.g. before freeing/snapshotting)."""
    p = plan or LaunchPlan()
    config = p.config
    _check_cache(ckpt, ring_x, ring_dt, ring_B, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    if pick_backend(backend, ckpt) == "ref":
        return mamba2_replay_flush_ref(ckpt, ring_x, ring_dt, ring_B, write_pos, A, slot_ids, L=L,
                                       min_room=min_room, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                       ckpt_lo_scale=ckpt_lo_scale, advance=advance)
    from .head_group import MODE_FLUSH, launch
    launch(MODE_FLUSH, ckpt, ring_x, ring_dt, ring_B, write_pos, None, None, A, None, None, None, None,
           slot_ids, None, None, L=L, T=1, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
           ckpt_lo_scale=ckpt_lo_scale, advance=advance, min_room=min_room, config=config)


def mamba2_replay_alloc(slots: int, H: int, P: int, N: int, G: int, L: int, *, dtype=torch.bfloat16,
                        ckpt_dtype=torch.float32, lo_dtype=None, device=None) -> dict:
    """Zero-initialised cache tensors (keys = the kernels' argument names). ``ckpt_dtype`` fp8
    gives ``ckpt_scale``; ``lo_dtype`` (bf16 / fp8) adds the dual-precision copy."""
    kw = dict(device=device)
    c = dict(ckpt=torch.zeros(slots, H, P, N, dtype=ckpt_dtype, **kw),
             ring_x=torch.zeros(slots, H, L, P, dtype=dtype, **kw),
             ring_dt=torch.zeros(slots, H, L, dtype=torch.float32, **kw),
             ring_B=torch.zeros(slots, G, L, N, dtype=dtype, **kw),
             write_pos=torch.zeros(slots, dtype=torch.int32, **kw))
    if is_fp8(c["ckpt"]):
        c["ckpt_scale"] = torch.ones(slots, H, P, dtype=torch.float32, **kw)
    if lo_dtype is not None:
        c["ckpt_lo"] = torch.zeros(slots, H, P, N, dtype=lo_dtype, **kw)
        if is_fp8(c["ckpt_lo"]):
            c["ckpt_lo_scale"] = torch.ones(slots, H, P, dtype=torch.float32, **kw)
    return c
