"""Gated DeltaNet ReplaySSM state backend kernels: cache the corrected value u, not the state.

Per slot and GDN layer the caller owns (see ``gdn_replay_alloc``):
  ckpt      [slots, HV, V, K]  checkpoint S0, the eager state layout (fp32 reference; bf16, or fp8
                               e4m3 + ``ckpt_scale`` [slots, HV, V] for single precision)
  ring_u    [slots, HV, L, V]  model dtype (corrected value u_t = beta (v_t - e^{g_t} S_{t-1} k_t))
  ring_k    [slots, Hk, L, K]  model dtype (L2-normalised k when use_qk_l2norm)
  ring_g    [slots, HV, L]     fp32 log-decay          write_pos [slots] int32
  ckpt_lo   optional dual-precision copy: bf16, or fp8 e4m3 + ``ckpt_lo_scale`` [slots, HV, V] fp32
            (one scale per (head, v) row over K).

route="adjoint" (output-only, default): outputs from S0 k_t / S0 q_t mat-vecs plus ring dot
products, O(L(K+V)) extra per row; route="state": rebuild S before the token (one matmul over the
ring, L x the FLOPs). Both flush the same way and give the same outputs.
Cursor contract: identical to ``synodic.kernels.mamba2_replay`` (decode flushes at wp >= L-1;
windows: ``gdn_replay_flush(min_room=T)`` -> ``gdn_replay_verify`` -> ``replay_commit``).
Precision notes: with bf16 rings, u and the normalised k are rounded when cached (eager keeps them
in fp32 inside the step): ~2.3e-3 relative RMSE vs eager on the H200 check at the real shapes;
fp32 rings restore 1e-4 parity (~+4 % bytes). Dual precision: u = beta (v - S k) reads the state,
so the low-precision copy's rounding reaches the cached u and, at the next flush, the fp32
checkpoint (unlike Mamba-2, where the copy only feeds outputs); measured ~10x smaller checkpoint
error than a single low-precision checkpoint.
Eager semantics (``gdn_decode``): S = e^g S; u = beta (v - S k); S += u k^T; o = S q, k and q
L2-normalised (eps 1e-6 under the sqrt), q times scale (default K^-1/2), value head h uses key
head h // (HV // Hk).
"""
from __future__ import annotations

import torch

from .. import replay_common as rc
from .._dispatch import pick_backend
from ..replay_common import LaunchPlan, is_fp8, replay_advance, replay_commit, replay_flush_reset
from .ref import gdn_replay_decode_ref, gdn_replay_flush_ref, gdn_replay_verify_ref

__all__ = ["gdn_replay_decode", "gdn_replay_verify", "gdn_replay_flush", "gdn_replay_alloc",
           "LaunchPlan", "replay_commit", "replay_advance", "replay_flush_reset"]



def _check_cache(ckpt, ring_u, ring_k, ring_g, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale):
    slots, HV, V, K = ckpt.shape
    Hk = ring_k.shape[1]
    if HV % Hk:
        raise ValueError(f"HV={HV} is not a multiple of Hk={Hk}")
    want = {"ring_u": (ring_u, (slots, HV, L, V)), "ring_k": (ring_k, (slots, Hk, L, K)),
            "ring_g": (ring_g, (slots, HV, L)), "write_pos": (write_pos, (slots,))}
    rc.check_ring(want, write_pos, L, ("ring_g", ring_g))
    rc.check_state_pair(ckpt, ckpt_scale, "ckpt", ckpt.shape)
    rc.check_state_pair(ckpt_lo, ckpt_lo_scale, "ckpt_lo", ckpt.shape)


def _inner(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _route(route: str) -> bool:
    if route not in ("state", "adjoint"):
        raise ValueError(f"route={route!r}: expected 'state' or 'adjoint'")
    return route == "state"


def gdn_replay_decode(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, *, L: int,
                      scale=None, use_qk_l2norm: bool = True, route: str = "adjoint", ckpt_scale=None,
                      ckpt_lo=None, ckpt_lo_scale=None, advance: bool = True, backend: str = "auto",
                      plan: LaunchPlan | None = None) -> torch.Tensor:
    """One decode step per row: q/k [b,Hk,K], v [b,HV,V], g [b,HV] log-decay, beta [b,HV]
    post-sigmoid -> o [b,HV,V] (v dtype), equal to eager ``gdn_decode``. Appends (u, k, g) at
    ring[write_pos]; at write_pos >= L-1 flushes instead (ckpt and ckpt_lo written, wp <- 0).

    ``impl`` (Triton): "per_head" = the eager-shaped adjoint kernel of ``decode`` (config = (BLOCK_V,
    warps); never moves write_pos, so ``advance=False``), "head_group" = the kernel of ``head_group`` (both
    routes, moves the cursor itself when ``advance``), "auto" = per-head for the adjoint route with
    ``advance=False``, else head-group. ``split`` (per-head): one fused launch (False) or an output-only launch plus a
    flush launch (True); None = ``decode.split_default``. ``ring_by_cursor`` (per-head): read the cursor before the
    ring so only written entries move; None = ``replay_common.ring_by_cursor_default``. ``ring_dots`` (per-head):
    the key-head dot products once per (row, key head) in a prologue launch; None =
    ``replay_common.ring_dots_default``. ``overlap`` (per-head, split): the flush launch on a side stream beside
    the output-only launch; None = ``replay_common.overlap_default``."""
    p = plan or LaunchPlan()
    config, impl, split, flush_config = p.config, p.impl, p.split, p.flush_config
    ring_by_cursor, ring_dots, overlap = p.ring_by_cursor, p.ring_dots, p.overlap
    state_route = _route(route)
    if impl not in ("auto", "head_group", "per_head"):
        raise ValueError(f"impl: expected 'auto', 'head_group' or 'per_head', got {impl!r}")
    if impl == "auto":
        impl = "head_group" if advance or state_route else "per_head"
    if impl == "per_head" and (advance or state_route):
        raise ValueError("impl='per_head' is the adjoint route and never moves write_pos: call it with "
                         "route='adjoint', advance=False (then replay_advance)")
    _check_cache(ckpt, ring_u, ring_k, ring_g, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    if pick_backend(backend, ckpt) == "ref":
        return gdn_replay_decode_ref(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, L=L,
                                     scale=scale, use_qk_l2norm=use_qk_l2norm, route=route,
                                     ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale,
                                     advance=advance)
    q, k, v = _inner(q), _inner(k), _inner(v)
    o = torch.empty_like(v)
    if impl == "per_head":
        from .decode import launch_decode
        return launch_decode(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, L=L,
                                scale=scale, use_qk_l2norm=use_qk_l2norm, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                ckpt_lo_scale=ckpt_lo_scale, config=config, split=split, flush_config=flush_config,
                                ring_by_cursor=ring_by_cursor, ring_dots=ring_dots, overlap=overlap)
    from .head_group import MODE_DECODE, launch
    launch(MODE_DECODE, ckpt, ring_u, ring_k, ring_g, write_pos, q.unsqueeze(1), k.unsqueeze(1),
           v.unsqueeze(1), g.unsqueeze(1), beta.unsqueeze(1), slot_ids, o.unsqueeze(1), L=L, T=1, scale=scale,
           use_qk_l2norm=use_qk_l2norm, route_state=state_route, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
           ckpt_lo_scale=ckpt_lo_scale, advance=advance, config=config)
    return o


def gdn_replay_verify(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, *, L: int,
                      scale=None, use_qk_l2norm: bool = True, ckpt_scale=None, ckpt_lo=None,
                      ckpt_lo_scale=None, backend: str = "auto", plan: LaunchPlan | None = None) -> torch.Tensor:
    """Outputs of a speculative window: q/k [b,T,Hk,K], v [b,T,HV,V], g/beta [b,T,HV] ->
    o [b,T,HV,V]. The window's corrections are solved by forward substitution
    ((I + A) U = R, A_sr = beta_s e^{G_s-G_r} k_s.k_r); no intermediate state is formed. Writes
    (u, k, g) of the window at ring[write_pos : write_pos+T] (caller guarantees write_pos + T <= L);
    write_pos and the checkpoint are untouched. Follow with ``replay_commit``.
    ``impl`` (Triton): "per_head" = the eager-shaped kernels of ``verify`` (one value head per program,
    state tile read once, ring loaded without waiting for the cursor, key-head dot products in a
    prologue kernel at larger batches; config = (BLOCK_V, num_warps[, gram[, maxnreg]])), "head_group" = the
    ``head_group`` kernel (config = (BLOCK_V, heads per program, num_warps[, maxnreg])); "auto" = per-head."""
    p = plan or LaunchPlan()
    config, impl = p.config, p.impl
    impls = ("auto", "head_group", "per_head")
    if impl not in impls:
        raise ValueError(f"impl: expected one of {impls}, got {impl!r}")
    _check_cache(ckpt, ring_u, ring_k, ring_g, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    T = v.shape[1]
    if T > L:
        raise ValueError(f"window T={T} exceeds the ring L={L}")
    if pick_backend(backend, ckpt) == "ref":
        return gdn_replay_verify_ref(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, L=L,
                                     scale=scale, use_qk_l2norm=use_qk_l2norm, ckpt_scale=ckpt_scale,
                                     ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale)
    q, k, v = _inner(q), _inner(k), _inner(v)
    o = torch.empty_like(v)
    if impl != "head_group":
        from .verify import launch_verify
        return launch_verify(ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, L=L,
                                scale=scale, use_qk_l2norm=use_qk_l2norm, ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo,
                                ckpt_lo_scale=ckpt_lo_scale, config=config)
    from .head_group import MODE_VERIFY, launch
    launch(MODE_VERIFY, ckpt, ring_u, ring_k, ring_g, write_pos, q, k, v, g, beta, slot_ids, o, L=L, T=T,
           scale=scale, use_qk_l2norm=use_qk_l2norm, route_state=False, ckpt_scale=ckpt_scale,
           ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale, advance=False, config=config)
    return o


def gdn_replay_flush(ckpt, ring_u, ring_k, ring_g, write_pos, slot_ids, *, L: int,
                     min_room: int | None = None, ckpt_scale=None, ckpt_lo=None, ckpt_lo_scale=None,
                     advance: bool = True,
                     backend: str = "auto", plan: LaunchPlan | None = None) -> None:
    """Fold ring[:write_pos] into the checkpoint for the rows' slots where write_pos > 0 and
    (min_room is None, or write_pos + min_room > L); refresh ckpt_lo; write_pos <- 0 there.
    Decided on the device (no host sync)."""
    p = plan or LaunchPlan()
    config = p.config
    _check_cache(ckpt, ring_u, ring_k, ring_g, write_pos, L, ckpt_scale, ckpt_lo, ckpt_lo_scale)
    if pick_backend(backend, ckpt) == "ref":
        return gdn_replay_flush_ref(ckpt, ring_u, ring_k, ring_g, write_pos, slot_ids, L=L, min_room=min_room,
                                    ckpt_scale=ckpt_scale, ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale,
                                    advance=advance)
    from .head_group import MODE_FLUSH, launch
    launch(MODE_FLUSH, ckpt, ring_u, ring_k, ring_g, write_pos, None, None, None, None, None, slot_ids, None,
           L=L, T=1, scale=None, use_qk_l2norm=True, route_state=False, ckpt_scale=ckpt_scale,
           ckpt_lo=ckpt_lo, ckpt_lo_scale=ckpt_lo_scale, advance=advance, min_room=min_room, config=config)


def gdn_replay_alloc(slots: int, HV: int, V: int, K: int, Hk: int, L: int, *, dtype=torch.bfloat16,
                     ckpt_dtype=torch.float32, lo_dtype=None, device=None) -> dict:
    """Zero-initialised cache tensors (keys = the kernels' argument names)."""
    kw = dict(device=device)
    c = dict(ckpt=torch.zeros(slots, HV, V, K, dtype=ckpt_dtype, **kw),
             ring_u=torch.zeros(slots, HV, L, V, dtype=dtype, **kw),
             ring_k=torch.zeros(slots, Hk, L, K, dtype=dtype, **kw),
             ring_g=torch.zeros(slots, HV, L, dtype=torch.float32, **kw),
             write_pos=torch.zeros(slots, dtype=torch.int32, **kw))
    if is_fp8(c["ckpt"]):
        c["ckpt_scale"] = torch.ones(slots, HV, V, dtype=torch.float32, **kw)
    if lo_dtype is not None:
        c["ckpt_lo"] = torch.zeros(slots, HV, V, K, dtype=lo_dtype, **kw)
        if is_fp8(c["ckpt_lo"]):
            c["ckpt_lo_scale"] = torch.ones(slots, HV, V, dtype=torch.float32, **kw)
    return c
