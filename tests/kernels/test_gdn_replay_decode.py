"""Gated DeltaNet ReplaySSM decode, impl="per_head" (eager-shaped Triton kernel, advance=False) vs the
torch reference, step by step with a shared cursor moved by ``replay_advance``.

Odd shapes (HV=6, Hk=3, V=5, K=7), L = 4, 2L+1 steps (two flushes per slot), rows at different
cursors (a slot joins late), padding rows, NaN-poisoned unwritten ring entries and output buffers.
"""
from __future__ import annotations

import pytest
import torch
from kernel_errors import rel_max as rel
from kernel_errors import rel_rmse as rrmse
from replay_fixtures import MODES, check_checkpoints, fill_state, poison, rows_for
from synodic.kernels.gdn_decode.ref import gdn_decode_ref
from synodic.kernels.gdn_replay import gdn_replay_alloc, gdn_replay_decode, replay_advance
from synodic.kernels.gdn_replay.decode import launch_decode
from synodic.kernels.replay_common import LaunchPlan

SLOTS = 4
L = 4


def fresh(gen, HV, Hk, V, K, mode, dtype=torch.float32):
    ck, lo = MODES[mode]
    c = gdn_replay_alloc(SLOTS, HV, V, K, Hk, L, dtype=dtype, ckpt_dtype=ck, lo_dtype=lo)
    S = fill_state(c, gen, (SLOTS, HV, V, K), mode, 0.3)
    poison(c, ("ring_u", "ring_k", "ring_g"))
    return c, S.clone()


def inputs(gen, b, HV, Hk, V, K, dtype=torch.float32):
    q = torch.randn(b, Hk, K, generator=gen).to(dtype)
    k = torch.randn(b, Hk, K, generator=gen).to(dtype)
    v = torch.randn(b, HV, V, generator=gen).to(dtype)
    g = -torch.rand(b, HV, generator=gen) * 0.5
    beta = torch.rand(b, HV, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def per_head_step(c, step, config, split=None, ring_by_cursor=None, ring_dots=None, **kw):
    """Even steps through the public dispatch, odd steps straight into the launcher with a
    NaN-poisoned output buffer (every element, padding rows included, must be written).
    split: None / False / True, or a flush launch config (split=True with that config)."""
    flush = split if isinstance(split, tuple) else None
    split = True if flush else split
    if step % 2 == 0:
        return gdn_replay_decode(**c, **kw, L=L, advance=False, backend="triton",
                                 plan=LaunchPlan(impl="per_head", config=config, split=split, flush_config=flush,
                                                 ring_by_cursor=ring_by_cursor, ring_dots=ring_dots))
    o = torch.full_like(kw["v"], float("nan"))
    launch_decode(c["ckpt"], c["ring_u"], c["ring_k"], c["ring_g"], c["write_pos"], kw["q"], kw["k"], kw["v"],
                     kw["g"], kw["beta"], kw["slot_ids"], o, L=L, scale=None, use_qk_l2norm=True,
                     ckpt_scale=c.get("ckpt_scale"), ckpt_lo=c.get("ckpt_lo"), ckpt_lo_scale=c.get("ckpt_lo_scale"),
                     config=config, split=split, flush_config=flush, ring_by_cursor=ring_by_cursor,
                     ring_dots=ring_dots)
    return o


CASES = [  # (HV, Hk, V, K, mode, config (BLOCK_V, warps[, fold]) or None = pick_decode_config, split[, ring by cursor])
    (6, 3, 5, 7, "fp32", (4, 2), False),          # two V-tiles, the second partial; K masked
    (6, 3, 5, 7, "fp32", (4, 2), False, True),    # the ring read only below the cursor (poisoned entries unread)
    (4, 2, 8, 16, "dual_bf16", (8, 1, "dot"), True, True),  # output-only launch: flushing rows skipped first
    (4, 2, 8, 16, "fp32", (8, 1), False),         # V a multiple of BLOCK_V, K a power of two (unmasked loads)
    (6, 3, 5, 7, "dual_bf16", None, False),
    (3, 1, 5, 7, "dual_fp8", (4, 2), False),      # per-row fp8 scales written by two V-tiles; 3 value heads / key head
    (6, 3, 5, 16, "single_fp8", None, False),
    (4, 2, 20, 24, "fp32", (16, 2, "dot"), False),       # flush as one fp32 dot over the ring; V-tile 2 partial
    (4, 2, 16, 16, "dual_bf16", (16, 1, "tf32x3"), False),  # the same on tensor cores (3-pass tf32)
    # two launches (output-only rows, then flushing rows): rows at different cursors flush in different steps;
    # a flush config (BLOCK_V, warps, fold, tiles per program) other than the output-only launch's
    (6, 3, 5, 7, "dual_bf16", (4, 2, "dot"), True),
    (3, 1, 5, 7, "dual_fp8", (4, 2), (8, 1, "tf32x3", 1)),       # one partial flush tile
    (6, 3, 5, 7, "fp32", (4, 2), (2, 1, "serial", 5)),           # 18 flush tiles, 5 per program: last partial
]


# the same with the key-head prologue (ring_dots): fused and split steps, serial and dot folds (the dot fold reads
# the key ring only when it flushes), 1-3 value heads per key head, an fp8 checkpoint
DOTS_CASES = [CASES[i] for i in (0, 2, 5, 6, 7, 11)]


@pytest.mark.parametrize("HV,Hk,V,K,mode,config,split,ring_by_cursor,ring_dots",
                         [c + (None,) * (8 - len(c)) + (False,) for c in CASES]
                         + [c + (None,) * (8 - len(c)) + (True,) for c in DOTS_CASES])
def test_per_head_decode_matches_ref_across_flushes(HV, Hk, V, K, mode, config, split, ring_by_cursor, ring_dots,
                                                    device):
    gen = torch.Generator().manual_seed(20 + HV + len(mode))
    c, _ = fresh(gen, HV, Hk, V, K, mode)
    c = {k: v.to(device) for k, v in c.items()}
    c_ref = {k: v.clone() for k, v in c.items()}
    worst = 0.0
    steps = 2 * L + 1
    for step in range(steps):
        sid = rows_for(step).to(device)
        kw = {k: t.to(device) for k, t in inputs(gen, len(sid), HV, Hk, V, K).items()}
        kw["slot_ids"] = sid
        wp = c["write_pos"].clone()
        o = per_head_step(c, step, config, split, ring_by_cursor, ring_dots, **kw)
        o_ref = gdn_replay_decode(**c_ref, **kw, L=L, advance=False, backend="ref")
        assert torch.equal(c["write_pos"], wp)  # per-head never moves the cursor
        assert not torch.isnan(o).any(), step
        assert torch.all(o[sid < 0] == 0)
        worst = max(worst, rrmse(o, o_ref))
        check_checkpoints(c, c_ref, mode, step)
        replay_advance(c["write_pos"], sid, L=L)
        replay_advance(c_ref["write_pos"], sid, L=L)
        for s in range(SLOTS):
            n = int(c["write_pos"][s])
            for key in ("ring_u", "ring_k", "ring_g"):
                torch.testing.assert_close(c[key][s, :, :n], c_ref[key][s, :, :n], rtol=1e-5, atol=1e-6)
    assert worst <= 1e-5, (mode, worst)
    assert c["write_pos"].tolist() == [steps % L, 0, steps % L, (steps - 2) % L]


def test_per_head_matches_eager_fp32(device):
    """End to end against eager fp32 decoding (not just the replay reference)."""
    HV, Hk, V, K = 6, 3, 5, 7
    gen = torch.Generator().manual_seed(3)
    c, S_eager = fresh(gen, HV, Hk, V, K, "fp32")
    c = {k: v.to(device) for k, v in c.items()}
    S_eager = S_eager.to(device)
    sid = torch.tensor([1, -1, 3, 0], dtype=torch.int32, device=device)
    for step in range(L + 2):
        kw = {k: t.to(device) for k, t in inputs(gen, 4, HV, Hk, V, K).items()}
        o = per_head_step(c, step, None, **kw, slot_ids=sid)
        o_eager = gdn_decode_ref(S_eager, kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], sid)
        assert rel(o, o_eager) <= 1e-4, step
        replay_advance(c["write_pos"], sid, L=L)
    assert c["write_pos"].tolist() == [2, 2, 0, 2]


@pytest.mark.parametrize("split,ring_by_cursor,fold,ring_dots", [
    (False, False, "serial", False), (True, False, "serial", False), (False, True, "serial", False),
    (True, True, "serial", False), (False, None, "bf16x3", False), (True, None, "bf16x3", False),
    (False, None, "serial", True), (False, None, "bf16x3", True), (True, None, "bf16x3", True)])
def test_per_head_full_ring_and_cursor_at_L(split, ring_by_cursor, fold, ring_dots, device):
    """Cursor at L (a verify committed a full window): the step flushes all L entries + this token;
    at L-1 it flushes too; bf16 ring / activations (bf16x3: the fold on bf16 tensor cores, fp32-exact)."""
    HV, Hk, V, K = 6, 3, 5, 7
    gen = torch.Generator().manual_seed(4)
    c, _ = fresh(gen, HV, Hk, V, K, "dual_bf16", dtype=torch.bfloat16)
    c["ring_u"].copy_(torch.randn(c["ring_u"].shape, generator=gen))
    c["ring_k"].copy_(torch.nn.functional.normalize(torch.randn(c["ring_k"].shape, generator=gen), dim=-1))
    c["ring_g"].copy_(-torch.rand(c["ring_g"].shape, generator=gen) * 0.5)
    c["write_pos"].copy_(torch.tensor([L, L - 1, 2, 0], dtype=torch.int32))
    c = {k: v.to(device) for k, v in c.items()}
    c_ref = {k: v.clone() for k, v in c.items()}
    sid = torch.tensor([0, 1, -1, 2, 3], dtype=torch.int32, device=device)
    kw = {k: t.to(device) for k, t in inputs(gen, 5, HV, Hk, V, K, dtype=torch.bfloat16).items()}
    o = per_head_step(c, 1, (4, 2, fold), split, ring_by_cursor, ring_dots, **kw, slot_ids=sid)
    o_ref = gdn_replay_decode(**c_ref, **kw, slot_ids=sid, L=L, advance=False, backend="ref")
    assert o.dtype == torch.bfloat16
    assert rel(o, o_ref) <= 1e-2  # bf16 outputs
    for key in ("ckpt", "ckpt_lo", "ring_u", "ring_k", "ring_g", "write_pos"):
        torch.testing.assert_close(c[key].float(), c_ref[key].float(), rtol=1e-5, atol=1e-5)


def test_per_head_argument_errors(device):
    HV, Hk, V, K = 3, 1, 5, 7
    gen = torch.Generator().manual_seed(5)
    c, _ = fresh(gen, HV, Hk, V, K, "fp32")
    kw = inputs(gen, 1, HV, Hk, V, K)
    sid = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="advance=False"):
        gdn_replay_decode(**c, **kw, slot_ids=sid, L=L, plan=LaunchPlan(impl="per_head"))
    with pytest.raises(ValueError, match="advance=False"):
        gdn_replay_decode(**c, **kw, slot_ids=sid, L=L, advance=False, route="state", plan=LaunchPlan(impl="per_head"))
    with pytest.raises(ValueError, match="impl"):
        gdn_replay_decode(**c, **kw, slot_ids=sid, L=L, plan=LaunchPlan(impl="v3"))
    with pytest.raises(ValueError, match="bf16 k ring"):  # an fp32 ring is not exact in bf16
        gdn_replay_decode(**{k: v.to(device) for k, v in c.items()}, **{k: v.to(device) for k, v in kw.items()},
                          slot_ids=sid.to(device), L=L, advance=False, backend="triton",
                          plan=LaunchPlan(impl="per_head", config=(4, 2, "bf16x3")))
