"""Mamba-2 ReplaySSM decode, impl="per_head" (eager-shaped Triton kernel, advance=False) vs the torch
reference, step by step with a shared cursor moved by ``replay_advance``.

Odd shapes, L = 4, 2L+1 steps (two flushes per slot), rows at different cursors (a slot joins
late), padding rows, NaN-poisoned unwritten ring entries and NaN-poisoned output buffers.
"""
from __future__ import annotations

import pytest
import torch
from kernel_errors import rel_max as rel
from kernel_errors import rel_rmse as rrmse
from replay_fixtures import MODES, check_checkpoints, fill_state, poison, rows_for
from synodic.kernels.mamba2_decode.ref import mamba2_decode_ref
from synodic.kernels.mamba2_replay import mamba2_replay_alloc, mamba2_replay_decode, replay_advance
from synodic.kernels.mamba2_replay.decode import launch_decode
from synodic.kernels.replay_common import LaunchPlan

SLOTS = 4
L = 4
# worst-step relative RMSE of y, per-head vs the reference (measured ~2e-7 in every mode: the kernel rounds
# its low-precision stores to nearest even like torch, see m2_decode._round_e4m3).
Y_TOL = {"fp32": 1e-5, "dual_bf16": 1e-5, "dual_fp8": 1e-5, "single_fp8": 1e-5}


def fresh(gen, H, G, P, N, mode, dtype=torch.float32):
    ck, lo = MODES[mode]
    c = mamba2_replay_alloc(SLOTS, H, P, N, G, L, dtype=dtype, ckpt_dtype=ck, lo_dtype=lo)
    S = fill_state(c, gen, (SLOTS, H, P, N), mode, 0.5)
    poison(c, ("ring_x", "ring_dt", "ring_B"))
    return c, S.clone()


def inputs(gen, b, H, G, P, N, dtype=torch.float32):
    x = torch.randn(b, H, P, generator=gen).to(dtype)
    dt = torch.randn(b, H, generator=gen)
    B = torch.randn(b, G, N, generator=gen).to(dtype)
    C = torch.randn(b, G, N, generator=gen).to(dtype)
    z = torch.randn(b, H, P, generator=gen).to(dtype)
    return x, dt, B, C, z


def params(gen, H):
    return -(torch.rand(H, generator=gen) + 0.3), torch.randn(H, generator=gen), torch.randn(H, generator=gen) * 0.5


def per_head_step(c, step, config, split=None, **kw):
    """Even steps through the public dispatch, odd steps straight into the launcher with a
    NaN-poisoned output buffer (every element, padding rows included, must be written).
    split: None / False / True, a flush launch config (split=True with that config), or "cursor_first"
    (split=True, the output-only launch reading the cursor first; launcher steps only); a "_ring" suffix
    (or "ring" alone: one fused launch) reads only the ring entries below the cursor; a "_dots" suffix after
    those ("split_dots": split=True) takes the group's dot products from the prologue (ring_dots)."""
    dots = isinstance(split, str) and split.endswith("_dots")
    if dots:
        split = split[:-len("_dots")]
        split = True if split == "split" else split
    flush = split if isinstance(split, tuple) else None
    ring = isinstance(split, str) and split.endswith("ring")
    if ring:
        split = False if split == "ring" else split[:-len("_ring")]
    first = split == "cursor_first"
    row_wp = None
    if split == "row_cursor":  # the output-only launch reads write_pos[slot_ids] gathered per step
        sid = kw["slot_ids"]
        row_wp = torch.where(sid >= 0, c["write_pos"][sid.clamp(min=0).long()], 0).to(torch.int32)
    split = True if (flush or first or row_wp is not None) else split
    if step % 2 == 0:
        return mamba2_replay_decode(**c, **kw, L=L, advance=False, backend="triton", row_wp=row_wp,
                                    plan=LaunchPlan(impl="per_head", config=config, split=split, flush_config=flush,
                                                    ring_by_cursor=ring, ring_dots=dots))
    y = torch.full_like(kw["x"], float("nan"))
    keys = ("x", "dt", "A", "B", "C", "D", "dt_bias", "slot_ids", "z")
    launch_decode(c["ckpt"], c["ring_x"], c["ring_dt"], c["ring_B"], c["write_pos"], *(kw[k] for k in keys), y,
                     L=L, ckpt_scale=c.get("ckpt_scale"), ckpt_lo=c.get("ckpt_lo"),
                     ckpt_lo_scale=c.get("ckpt_lo_scale"), config=config, split=split, flush_config=flush,
                     cursor_first=first, row_wp=row_wp, ring_by_cursor=ring, ring_dots=dots)
    return y


CASES = [  # (H, G, P, N, mode, config (BLOCK_P, warps[, fold]) or None = the eager rule, serial fold, split)
    (3, 1, 5, 7, "fp32", (4, 4, "dot"), False),   # two P-tiles, the second partial; flush by one fp32 dot
    (6, 3, 12, 16, "fp32", (8, 4), False),        # 3 groups of 2 heads, two P-tiles
    (3, 1, 5, 7, "dual_bf16", None, False),
    (6, 3, 8, 16, "dual_bf16", None, False),      # P a multiple of BLOCK_P (unmasked ring x tile)
    (3, 1, 5, 7, "dual_fp8", (4, 4), False),      # per-row fp8 scales written by two P-tiles
    (6, 3, 5, 16, "single_fp8", None, False),
    (3, 1, 20, 16, "dual_bf16", (16, 2, "tf32x3"), False),  # flush as one 3-pass tf32 dot (dual default at 256)
    # two launches (output-only rows, then flushing rows): rows at different cursors flush in different steps;
    # a flush config (BLOCK_P, warps, fold, tiles per program) other than the output-only launch's
    (3, 1, 20, 16, "dual_bf16", (16, 2, "tf32x3"), True),
    (3, 1, 5, 7, "dual_fp8", (4, 4), (8, 2, "dot", 1)),           # one partial flush tile
    (6, 3, 12, 16, "fp32", (8, 4), (4, 2, "serial", 4)),          # 18 flush tiles, 4 per program: last partial
    (6, 3, 5, 16, "single_fp8", None, True),
    (6, 3, 8, 16, "dual_bf16", None, "row_cursor"),
    (3, 1, 5, 7, "fp32", (4, 4, "serial"), "ring"),            # the ring read only below the cursor
    (6, 3, 8, 16, "dual_bf16", None, "row_cursor_ring"),
    (3, 1, 5, 7, "dual_bf16", (4, 2, "tf32x3"), "cursor_first_ring"),
    # the output-only launch with the group prologue (ring_dots): 1 and 3 groups, each cursor mode
    (3, 1, 20, 16, "dual_bf16", (16, 2, "tf32x3"), "split_dots"),
    (6, 3, 12, 16, "fp32", (8, 4), "split_dots"),
    (6, 3, 5, 16, "single_fp8", None, "split_dots"),
    (6, 3, 8, 16, "dual_bf16", None, "row_cursor_ring_dots"),
    (3, 1, 5, 7, "dual_bf16", (4, 2, "tf32x3"), "cursor_first_ring_dots"),
]


@pytest.mark.parametrize("H,G,P,N,mode,config,split", CASES)
def test_per_head_decode_matches_ref_across_flushes(H, G, P, N, mode, config, split, device):
    gen = torch.Generator().manual_seed(10 + H + len(mode))
    A, D, bias = params(gen, H)
    c, _ = fresh(gen, H, G, P, N, mode)
    c = {k: v.to(device) for k, v in c.items()}
    A, D, bias = A.to(device), D.to(device), bias.to(device)
    c_ref = {k: v.clone() for k, v in c.items()}
    worst = 0.0
    steps = 2 * L + 1
    for step in range(steps):
        sid = rows_for(step).to(device)
        x, dt, B, C, z = (t.to(device) for t in inputs(gen, len(sid), H, G, P, N))
        if step % 3 == 1:
            z = None
        kw = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, z=z)
        wp = c["write_pos"].clone()
        y = per_head_step(c, step, config, split, **kw)
        y_ref = mamba2_replay_decode(**c_ref, **kw, L=L, advance=False, backend="ref")
        assert torch.equal(c["write_pos"], wp)  # per-head never moves the cursor
        assert not torch.isnan(y).any(), step
        assert torch.all(y[sid < 0] == 0)
        err = rrmse(y, y_ref)
        worst = max(worst, err)
        fl = [s for s in sid.tolist() if s >= 0 and int(wp[s]) >= L - 1]
        # the fp32 checkpoint (the recurrence) is exact in every fp32-checkpoint mode
        check_checkpoints(c, c_ref, mode, step)
        if MODES[mode][0] == torch.float32:
            for i, s in enumerate(sid.tolist()):
                if s in fl:  # flush step: y = S_t . C_t from the fp32 state
                    assert rel(y[i], y_ref[i]) <= 1e-5, (step, s)
        replay_advance(c["write_pos"], sid, L=L)
        replay_advance(c_ref["write_pos"], sid, L=L)
        for s in range(SLOTS):
            n = int(c["write_pos"][s])
            for k in ("ring_x", "ring_B"):  # copies of the inputs
                assert torch.equal(c[k][s, :, :n], c_ref[k][s, :, :n]), (step, s, k)
            torch.testing.assert_close(c["ring_dt"][s, :, :n], c_ref["ring_dt"][s, :, :n], rtol=1e-6, atol=1e-6)
    assert worst <= Y_TOL[mode], (mode, worst)
    # cursors: tokens since the last flush (slot 1 never used, slot 3 joined at step 2)
    assert c["write_pos"].tolist() == [steps % L, 0, steps % L, (steps - 2) % L]


def test_per_head_matches_eager_fp32(device):
    """End to end against eager fp32 decoding (not just the replay reference)."""
    H, G, P, N = 6, 3, 5, 7
    gen = torch.Generator().manual_seed(3)
    A, D, bias = (t.to(device) for t in params(gen, H))
    c, S_eager = fresh(gen, H, G, P, N, "fp32")
    c = {k: v.to(device) for k, v in c.items()}
    S_eager = S_eager.to(device)
    sid = torch.tensor([1, -1, 3, 0], dtype=torch.int32, device=device)
    for step in range(L + 2):
        x, dt, B, C, z = (t.to(device) for t in inputs(gen, 4, H, G, P, N))
        y = per_head_step(c, step, None, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, z=z)
        y_eager = mamba2_decode_ref(S_eager, x, dt, A, B, C, D, bias, sid, z)
        assert rel(y, y_eager) <= 1e-4, step
        replay_advance(c["write_pos"], sid, L=L)
    assert c["write_pos"].tolist() == [2, 2, 0, 2]


@pytest.mark.parametrize("fold,split", [("serial", False), ("dot", False), ("tf32x3", False), ("tf32x3", True),
                                        ("tf32x3", "cursor_first"), ("tf32x3", "row_cursor"), ("bf16x3", False),
                                        ("bf16x3", "ring"), ("tf32x3", "row_cursor_ring"),
                                        ("tf32x3", (16, 4, "bf16x3", 2)), ("tf32x3", (16, 4, "bf16x3", 1)),
                                        ("tf32x3", "split_dots"), ("tf32x3", "row_cursor_dots")])
def test_per_head_full_ring_and_cursor_at_L(fold, split, device):
    """Cursor at L (a verify committed a full window): the step flushes all L entries + this token;
    at L-1 it flushes too; bf16 ring / activations."""
    H, G, P, N = 6, 3, 5, 7
    gen = torch.Generator().manual_seed(4)
    A, D, bias = (t.to(device) for t in params(gen, H))
    c, _ = fresh(gen, H, G, P, N, "dual_bf16", dtype=torch.bfloat16)
    c["ring_x"].copy_(torch.randn(c["ring_x"].shape, generator=gen))
    c["ring_dt"].copy_(torch.rand(c["ring_dt"].shape, generator=gen))
    c["ring_B"].copy_(torch.randn(c["ring_B"].shape, generator=gen))
    c["write_pos"].copy_(torch.tensor([L, L - 1, 2, 0], dtype=torch.int32))
    c = {k: v.to(device) for k, v in c.items()}
    c_ref = {k: v.clone() for k, v in c.items()}
    sid = torch.tensor([0, 1, -1, 2, 3], dtype=torch.int32, device=device)
    x, dt, B, C, z = (t.to(device) for t in inputs(gen, 5, H, G, P, N, dtype=torch.bfloat16))
    kw = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, z=z)
    y = per_head_step(c, 1, (4, 4, fold), split, **kw)
    y_ref = mamba2_replay_decode(**c_ref, **kw, L=L, advance=False, backend="ref")
    assert y.dtype == torch.bfloat16
    assert rel(y, y_ref) <= 1e-2  # bf16 outputs
    for k in ("ckpt", "ckpt_lo", "ring_x", "ring_dt", "ring_B", "write_pos"):
        torch.testing.assert_close(c[k].float(), c_ref[k].float(), rtol=1e-5, atol=1e-5)


def test_per_head_needs_advance_false(device):
    H, G, P, N = 3, 1, 5, 7
    gen = torch.Generator().manual_seed(5)
    A, D, bias = params(gen, H)
    c, _ = fresh(gen, H, G, P, N, "fp32")
    c = {k: v.to(device) for k, v in c.items()}
    A, D, bias = A.to(device), D.to(device), bias.to(device)
    x, dt, B, C, z = (t.to(device) for t in inputs(gen, 1, H, G, P, N))
    sid = torch.tensor([0], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="advance=False"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             plan=LaunchPlan(impl="per_head"))
    with pytest.raises(ValueError, match="fold"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton", plan=LaunchPlan(impl="per_head", config=(8, 4, "fma")))
    with pytest.raises(ValueError, match=r"expected \(BLOCK, num_warps"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton", plan=LaunchPlan(impl="per_head", config=(8,)))
    with pytest.raises(ValueError, match="flush_config: fold"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton",
                             plan=LaunchPlan(impl="per_head", split=True, flush_config=(8, 2, "fma")))
    with pytest.raises(ValueError, match=r"flush_config: expected \(BLOCK, num_warps"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton",
                             plan=LaunchPlan(impl="per_head", split=True, flush_config=(8, 2, "dot", 4, 1)))
    with pytest.raises(ValueError, match="flush_config: tiles per program"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton",
                             plan=LaunchPlan(impl="per_head", split=True, flush_config=(8, 2, "dot", 0)))
    with pytest.raises(ValueError, match="row_wp: expected int32"):
        launch_decode(c["ckpt"], c["ring_x"], c["ring_dt"], c["ring_B"], c["write_pos"], x, dt, A, B, C, D, bias,
                         sid, None, torch.empty_like(x), L=L, split=True, row_wp=sid.long())
    with pytest.raises(ValueError, match="fold 'bf16x3' needs a bf16 B ring"):  # this cache's ring is fp32
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             advance=False, backend="triton",
                             plan=LaunchPlan(impl="per_head", split=True, flush_config=(8, 2, "bf16x3")))
    with pytest.raises(ValueError, match="impl"):
        mamba2_replay_decode(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, L=L,
                             plan=LaunchPlan(impl="v3"))
