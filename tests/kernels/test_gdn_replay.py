"""Gated DeltaNet ReplaySSM kernels (both routes) vs the eager decode reference.

Odd shapes (HV=6, Hk=3, V=5, K=7), small L; error = max |o - o_eager| / max |o_eager| per step.
"""
from __future__ import annotations

import pytest
import torch
from kernel_errors import rel_max as rel
from kernel_errors import rel_rmse as rrmse
from synodic.kernels.gdn_decode.ref import gdn_decode_ref
from synodic.kernels.gdn_replay import (
    gdn_replay_alloc,
    gdn_replay_decode,
    gdn_replay_flush,
    gdn_replay_verify,
    replay_commit,
)
from synodic.kernels.replay_common import LaunchPlan, quantize_rows_fp8, store_state

HV, HK, V, K = 6, 3, 5, 7
SLOTS = 4




def step_inputs(gen, b, device, T=None, dtype=torch.float32, HV=HV, Hk=HK, V=V, K=K):
    lead = (b,) if T is None else (b, T)
    q = torch.randn(*lead, Hk, K, generator=gen)
    k = torch.randn(*lead, Hk, K, generator=gen)
    v = torch.randn(*lead, HV, V, generator=gen)
    g = -torch.rand(*lead, HV, generator=gen) * 0.5          # log-decay
    beta = torch.rand(*lead, HV, generator=gen)              # post-sigmoid
    return [q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), g.to(device), beta.to(device)]


def fresh(device, L, gen, dtype=torch.float32, ckpt_dtype=torch.float32, lo_dtype=None, HV=HV, Hk=HK, V=V, K=K):
    c = gdn_replay_alloc(SLOTS, HV, V, K, Hk, L, dtype=dtype, ckpt_dtype=ckpt_dtype, lo_dtype=lo_dtype,
                         device=device)
    S = torch.randn(SLOTS, HV, V, K, generator=gen).to(device) * 0.3
    if ckpt_dtype == torch.float8_e4m3fn:
        q, sc = quantize_rows_fp8(S)
        c["ckpt"].copy_(q)
        c["ckpt_scale"].copy_(sc)
        S = q.float() * sc[..., None]
    else:
        c["ckpt"].copy_(S.to(ckpt_dtype))
        S = c["ckpt"].float()
    if lo_dtype is not None:
        store_state(c["ckpt_lo"], c.get("ckpt_lo_scale"), S)
    for key in ("ring_u", "ring_k", "ring_g"):
        c[key].fill_(float("nan"))  # unwritten ring entries must never be read
    return c, S.clone()


def rows_for(step, device):
    rows = [2, 0, -1] if step < 2 else [0, 3, 2] if step % 2 else [3, -1, 2, 0]
    return torch.tensor(rows, dtype=torch.int32, device=device)


@pytest.mark.parametrize("backend,route", [("ref", "state"), ("ref", "adjoint"), ("triton", "state"),
                                           ("triton", "adjoint")])
def test_decode_matches_eager_across_flushes(backend, route, device):
    L = 4
    gen = torch.Generator().manual_seed(0)
    c, S_eager = fresh(device, L, gen)
    c_ref = {k: v.clone() for k, v in c.items()}
    steps = 2 * L + 1
    for step in range(steps):
        sid = rows_for(step, device)
        q, k, v, g, beta = step_inputs(gen, len(sid), device)
        o = gdn_replay_decode(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, route=route, backend=backend)
        o_eager = gdn_decode_ref(S_eager, q, k, v, g, beta, sid)
        assert rel(o, o_eager) <= 1e-4, (step, rel(o, o_eager))
        assert torch.all(o[sid < 0] == 0)
        for s in sid.tolist():
            if s >= 0 and int(c["write_pos"][s]) == 0:  # just flushed: the exact eager state
                assert rel(c["ckpt"][s], S_eager[s]) <= 1e-5
        if backend == "triton":
            o_ref = gdn_replay_decode(**c_ref, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, route=route,
                                      backend="ref")
            assert rel(o, o_ref) <= 1e-5
            assert torch.equal(c["write_pos"], c_ref["write_pos"])
            for s in range(SLOTS):
                n = int(c["write_pos"][s])
                for key in ("ring_u", "ring_k", "ring_g"):
                    torch.testing.assert_close(c[key][s, :, :n], c_ref[key][s, :, :n], rtol=1e-5, atol=1e-6)
    assert c["write_pos"].tolist() == [steps % L, 0, steps % L, (steps - 2) % L]


@pytest.mark.parametrize("backend", ["ref", "triton"])
def test_verify_commit_flush_vs_sequential(backend, device):
    """T=3 windows: forward substitution of the window's corrections vs sequential eager, variable
    acceptance, repeated rejection, early flushes, ring wrap-around, decode at wp = L."""
    L, T = 6, 3
    gen = torch.Generator().manual_seed(1)
    c, S_eager = fresh(device, L, gen)
    sid = torch.tensor([1, -1, 3, 0], dtype=torch.int32, device=device)
    live = sid >= 0
    accept_plan = [[3, 0, 1, 2], [1, 0, 3, 3], [1, 0, 2, 3], [2, 0, 3, 1], [1, 0, 1, 3]]
    for rnd, acc in enumerate(accept_plan):
        if rnd in (3, 4):
            q, k, v, g, beta = step_inputs(gen, len(sid), device)
            o = gdn_replay_decode(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, backend=backend)
            assert rel(o, gdn_decode_ref(S_eager, q, k, v, g, beta, sid)) <= 1e-4
        wp_before = c["write_pos"].clone()
        gdn_replay_flush(**c, slot_ids=sid, L=L, min_room=T, backend=backend)
        for s in sid[live].tolist():
            w = int(wp_before[s])
            if w + T > L:
                assert int(c["write_pos"][s]) == 0
                assert rel(c["ckpt"][s], S_eager[s]) <= 1e-5
            else:
                assert int(c["write_pos"][s]) == w
        q, k, v, g, beta = step_inputs(gen, len(sid), device, T=T)
        o = gdn_replay_verify(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, backend=backend)
        S_tmp, states = S_eager.clone(), []
        for r in range(T):
            o_r = gdn_decode_ref(S_tmp, q[:, r], k[:, r], v[:, r], g[:, r], beta[:, r], sid)
            assert rel(o[:, r], o_r) <= 1e-4, (rnd, r, rel(o[:, r], o_r))
            states.append(S_tmp.clone())
        assert torch.all(o[~live] == 0)
        wp0 = c["write_pos"].clone()
        replay_commit(c["write_pos"], torch.tensor(acc, device=device), sid)
        for i, s in enumerate(sid.tolist()):
            if s >= 0:
                assert int(c["write_pos"][s]) == int(wp0[s]) + acc[i]
                S_eager[s] = states[acc[i] - 1][s]
    gdn_replay_flush(**c, slot_ids=sid, L=L, backend=backend)
    for s in sid[live].tolist():
        assert int(c["write_pos"][s]) == 0
        assert rel(c["ckpt"][s], S_eager[s]) <= 1e-5


# Worst-step relative RMSE of o vs eager fp32 over 3 flush cycles. Measured (torch ref, RTNE):
# see the Mamba-2 test; GDN reads S0 twice per step (S0 k, S0 q) and feeds S0 k into u, so the
# low-precision error also enters the cached u (not the fp32 checkpoint, which stays exact).
PRECISION_BOUNDS = {"dual_bf16": 1.5e-2, "dual_fp8": 1e-1, "single_bf16": 2e-2, "single_fp8": 1.5e-1}


@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("mode", list(PRECISION_BOUNDS))
def test_precision_modes_bounded(mode, backend, device):
    if backend == "triton" and mode in ("dual_bf16", "single_bf16"):
        pytest.skip("bf16 paths are covered by the fp8 ones on the interpreter (time)")
    L = 4
    lo = {"dual_bf16": torch.bfloat16, "dual_fp8": torch.float8_e4m3fn}.get(mode)
    ck = {"single_bf16": torch.bfloat16, "single_fp8": torch.float8_e4m3fn}.get(mode, torch.float32)
    gen = torch.Generator().manual_seed(2)
    dims = dict(HV=2, Hk=1, V=16, K=32)
    c, S_eager = fresh(device, L, gen, ckpt_dtype=ck, lo_dtype=lo, **dims)
    sid = torch.tensor([0, 2], dtype=torch.int32, device=device)
    worst, worst_ck = 0.0, 0.0
    for step in range(3 * L + 1):
        q, k, v, g, beta = step_inputs(gen, 2, device, **dims)
        o = gdn_replay_decode(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, backend=backend)
        worst = max(worst, rrmse(o, gdn_decode_ref(S_eager, q, k, v, g, beta, sid)))
        if step % L == L - 1:  # just flushed
            ck = c["ckpt"][sid.long()].float()
            if "ckpt_scale" in c:
                ck = ck * c["ckpt_scale"][sid.long()][..., None]
            worst_ck = max(worst_ck, rrmse(ck, S_eager[sid.long()]))
    assert worst <= PRECISION_BOUNDS[mode], (mode, worst)
    # unlike Mamba-2, u = beta (v - S k) reads the state, so in dual precision the low-precision
    # copy's rounding reaches the cached u and from there the fp32 checkpoint; measured ~10x below
    # single precision's checkpoint error (dual_bf16 1.9e-4 vs single_bf16 1.9e-3)
    bound_ck = PRECISION_BOUNDS[mode] / (5 if lo is not None else 1)
    assert worst_ck <= bound_ck, (mode, worst_ck)


def test_bf16_model_dtype(device):
    """bf16 inputs, bf16 ring (u and normalised k rounded to bf16 when cached)."""
    L = 2
    gen = torch.Generator().manual_seed(4)
    c, S_eager = fresh(device, L, gen, dtype=torch.bfloat16)
    sid = torch.tensor([3, 1], dtype=torch.int32, device=device)
    for _ in range(3):
        q, k, v, g, beta = step_inputs(gen, 2, device, dtype=torch.bfloat16)
        o = gdn_replay_decode(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, backend="triton")
        assert o.dtype == torch.bfloat16
        assert rel(o, gdn_decode_ref(S_eager, q, k, v, g, beta, sid)) <= 2e-2


def test_heads_per_program(device):
    """config=(BLOCK_V, value heads/program=2, warps): both value heads of a key head in one
    program (k.k / k.q formed once), the key head's ring k written once."""
    L = 2
    gen = torch.Generator().manual_seed(6)
    c, S_eager = fresh(device, L, gen)
    sid = torch.tensor([1, 3], dtype=torch.int32, device=device)
    for _ in range(L + 1):
        q, k, v, g, beta = step_inputs(gen, 2, device)
        o = gdn_replay_decode(**c, q=q, k=k, v=v, g=g, beta=beta, slot_ids=sid, L=L, backend="triton",
                              plan=LaunchPlan(config=(8, 2, 4)))
        assert rel(o, gdn_decode_ref(S_eager, q, k, v, g, beta, sid)) <= 1e-4
