"""ReplaySSM speculative verify, impl="per_head" (Mamba-2 and GDN, eager-shaped Triton kernels) vs the torch
reference (and head-group on a few cases).

Odd shapes (odd head counts, P / V / N / K not powers of two, partial last tiles), T in {1, 3, 4}, one
launch with rows at cursor 0, mid-ring and wp + T == L, a padding row (slot -1), an unused slot,
NaN-poisoned ring entries past the cursor (must never reach an output), fp32 / dual bf16 / dual fp8 /
single fp8 checkpoints, fp32 and bf16 model tensors. Checked: y, the ring entries written at
[wp, wp + T), everything else (other ring entries, checkpoints, write_pos) bit-untouched.
"""
from __future__ import annotations

import pytest
import torch
from kernel_errors import rel_max as rel
from replay_fixtures import MODES, fill_state
from synodic.kernels.gdn_replay import gdn_replay_alloc, gdn_replay_verify
from synodic.kernels.gdn_replay.verify import launch_verify as gdn_launch_verify
from synodic.kernels.mamba2_replay import mamba2_replay_alloc, mamba2_replay_verify
from synodic.kernels.mamba2_replay.verify import launch_verify as mamba_launch_verify
from synodic.kernels.replay_common import LaunchPlan

L = 6
SLOTS = 4


def cursors(T):
    """write_pos per slot: 0, mid-ring, (slot 2 unused), wp + T == L."""
    return torch.tensor([0, (L - T) // 2, 1, L - T], dtype=torch.int32)


SLOT_IDS = torch.tensor([3, -1, 0, 1], dtype=torch.int32)  # slot 2 untouched, one padding row


def poison_ring(c, names, T, gen):
    """Ring entries < wp: random history; >= wp: NaN (stale entries must never be read)."""
    wp = cursors(T)
    for name, lo, hi in names:
        t = c[name]
        t.copy_((torch.rand(t.shape, generator=gen) * (hi - lo) + lo).to(t.dtype))
        for s in range(SLOTS):
            t[s, :, int(wp[s]):] = float("nan")
    c["write_pos"].copy_(wp)


def same(a, b):
    return torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0))


def check_ring_and_untouched(c, c_ref, c0, ring_tols, T):
    wp = cursors(T)
    for key in c:
        if key in ring_tols:
            continue
        assert torch.equal(c[key], c0[key]), key  # checkpoints, scales, write_pos: never written
    for key, tol in ring_tols.items():
        for s in range(SLOTS):
            w = int(wp[s])
            live = s in SLOT_IDS.tolist()
            hi = w + T if live else w
            # entries outside [wp, wp+T) (and all of an unused slot) bit-untouched
            assert same(c[key][s, :, :w], c0[key][s, :, :w]), (key, s)
            assert same(c[key][s, :, hi:], c0[key][s, :, hi:]), (key, s)
            if live:
                torch.testing.assert_close(c[key][s, :, w:hi].float(), c_ref[key][s, :, w:hi].float(),
                                           rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------------------
# Mamba-2
# ---------------------------------------------------------------------------------------------------------
MAMBA_CASES = [  # (H, G, P, N, T, mode, model dtype, config (BLOCK_P, warps, gram) or None, z, direct launch)
    (3, 1, 5, 7, 3, "fp32", torch.float32, (4, 2, True), True, True),        # two P-tiles, the second partial
    (9, 3, 6, 12, 4, "dual_bf16", torch.float32, (8, 2, True), False, False),  # 3 groups x 3 heads, N = 12
    (5, 5, 5, 10, 1, "dual_fp8", torch.float32, None, True, True),           # G = H, T = 1, one launch
    (3, 1, 12, 16, 4, "single_fp8", torch.bfloat16, (8, 4, False), True, False),  # bf16 ring / activations / y
    # dot=True: the T state products as one tf32x3 tl.dot over a [BLOCK_P, N] tile (P, N not powers of two)
    (3, 1, 20, 24, 3, "fp32", torch.float32, (16, 2, True, None, True), True, True),
    (3, 3, 16, 16, 4, "dual_fp8", torch.float32, (16, 4, False, None, True), False, False),
]


def mamba_problem(H, G, P, N, T, mode, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    ck, lo = MODES[mode]
    c = mamba2_replay_alloc(SLOTS, H, P, N, G, L, dtype=dtype, ckpt_dtype=ck, lo_dtype=lo)
    fill_state(c, gen, (SLOTS, H, P, N), mode, 0.5)
    poison_ring(c, [("ring_x", -2.0, 2.0), ("ring_dt", 0.0, 0.6), ("ring_B", -2.0, 2.0)], T, gen)
    b = len(SLOT_IDS)
    kw = dict(x=torch.randn(b, T, H, P, generator=gen).to(dtype), dt=torch.randn(b, T, H, generator=gen),
              A=-(torch.rand(H, generator=gen) + 0.3), B=torch.randn(b, T, G, N, generator=gen).to(dtype),
              C=torch.randn(b, T, G, N, generator=gen).to(dtype), D=torch.randn(H, generator=gen),
              dt_bias=torch.randn(H, generator=gen) * 0.5, slot_ids=SLOT_IDS.clone(),
              z=torch.randn(b, T, H, P, generator=gen).to(dtype))
    return c, kw


def mamba_on(device, use_z, *problem, seed):
    """A mamba_problem on the test device (z dropped unless use_z), with two untouched copies of its cache: the
    state before the call and the reference's own."""
    c, kw = mamba_problem(*problem, seed=seed)
    if not use_z:
        kw["z"] = None
    c = {k: v.to(device) for k, v in c.items()}
    kw = {k: (v.to(device) if v is not None else None) for k, v in kw.items()}
    return c, kw, {k: v.clone() for k, v in c.items()}, {k: v.clone() for k, v in c.items()}


@pytest.mark.parametrize("H,G,P,N,T,mode,dtype,config,use_z,direct", MAMBA_CASES)
def test_mamba2_verify_per_head_matches_ref(H, G, P, N, T, mode, dtype, config, use_z, direct, device):
    c, kw, c0, c_ref = mamba_on(device, use_z, H, G, P, N, T, mode, dtype, seed=H * 100 + N + T)
    if direct:  # straight into the launcher with a NaN-poisoned output: every element must be written
        y = torch.full_like(kw["x"], float("nan"))
        keys = ("x", "dt", "A", "B", "C", "D", "dt_bias", "slot_ids", "z")
        mamba_launch_verify(c["ckpt"], c["ring_x"], c["ring_dt"], c["ring_B"], c["write_pos"], *(kw[k] for k in keys),
                            y,
                        L=L, ckpt_scale=c.get("ckpt_scale"), ckpt_lo=c.get("ckpt_lo"),
                        ckpt_lo_scale=c.get("ckpt_lo_scale"), config=config)
    else:
        y = mamba2_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(impl="per_head", config=config))
    y_ref = mamba2_replay_verify(**c_ref, **kw, L=L, backend="ref")
    assert y.dtype == dtype and not torch.isnan(y).any()
    assert torch.all(y[kw["slot_ids"] < 0] == 0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 y: one-ulp flips
    assert rel(y, y_ref) <= tol, rel(y, y_ref)
    check_ring_and_untouched(c, c_ref, c0, {"ring_x": 0.0, "ring_dt": 1e-6, "ring_B": 0.0}, T)


GROUP_CASES = [  # (H, G, P, N, T, mode, model dtype, config (num_warps, num_stages[, head splits]) or None, z)
    (3, 1, 5, 7, 3, "fp32", torch.float32, (4, 2), True),                 # P, N below tl.dot's 16, padded
    (9, 3, 6, 12, 4, "dual_bf16", torch.float32, (4, 1, 3), False),       # three programs a group, one head each
    (5, 5, 5, 10, 1, "dual_fp8", torch.float32, None, True),              # G = H, T = 1
    (4, 2, 12, 16, 4, "single_fp8", torch.bfloat16, (2, 3, 2), True),     # bf16 ring / activations / y
    (6, 2, 20, 24, 3, "fp32", torch.float32, (4, 2), True),               # P, N not powers of two, above 16
]


@pytest.mark.parametrize("H,G,P,N,T,mode,dtype,config,use_z", GROUP_CASES)
def test_mamba2_verify_group_matches_ref(H, G, P, N, T, mode, dtype, config, use_z, device):
    c, kw, c0, c_ref = mamba_on(device, use_z, H, G, P, N, T, mode, dtype, seed=H * 10 + N + T)
    y = mamba2_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(impl="group", config=config))
    y_ref = mamba2_replay_verify(**c_ref, **kw, L=L, backend="ref")
    assert y.dtype == dtype and not torch.isnan(y).any()
    assert torch.all(y[kw["slot_ids"] < 0] == 0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(y, y_ref) <= tol, rel(y, y_ref)
    check_ring_and_untouched(c, c_ref, c0, {"ring_x": 0.0, "ring_dt": 1e-6, "ring_B": 0.0}, T)


def test_mamba2_verify_group_rejects_bad_split(device):
    c, kw = mamba_problem(6, 2, 5, 7, 3, "fp32", torch.float32, seed=1)
    c, kw = ({k: v.to(device) for k, v in d.items()} for d in (c, kw))
    with pytest.raises(ValueError, match="head splits"):
        mamba2_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(impl="group", config=(4, 2, 2)))


def test_mamba2_verify_auto_picks_group_for_large_fp32_windows():
    from synodic.kernels.mamba2_replay import GROUP_MIN_ROWS, _verify_impl
    fp32, bf16 = torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.bfloat16)
    assert _verify_impl("auto", GROUP_MIN_ROWS, fp32) == "group"
    assert _verify_impl("auto", GROUP_MIN_ROWS - 1, fp32) == "per_head"
    assert _verify_impl("auto", GROUP_MIN_ROWS, fp32, ckpt_lo=bf16) == "per_head"  # dual precision: equal speed
    assert _verify_impl("auto", GROUP_MIN_ROWS, fp32, config=(64, 2, True)) == "per_head"  # a per-head config
    assert _verify_impl("per_head", GROUP_MIN_ROWS, fp32) == "per_head"


@pytest.mark.parametrize("gram", [False, True])
def test_mamba2_verify_per_head_matches_head_group(gram, device):
    H, G, P, N, T = 6, 2, 5, 7, 3
    c, kw = mamba_problem(H, G, P, N, T, "fp32", torch.float32, seed=7)
    c = {k: v.to(device) for k, v in c.items()}
    kw = {k: v.to(device) for k, v in kw.items()}
    c1 = {k: v.clone() for k, v in c.items()}
    y2 = mamba2_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(config=(8, 2, gram)))  # auto = per-head
    y1 = mamba2_replay_verify(**c1, **kw, L=L, backend="triton", plan=LaunchPlan(impl="head_group"))
    assert rel(y2, y1) <= 1e-5
    for k in c:
        torch.testing.assert_close(c[k].float().nan_to_num(7.0), c1[k].float().nan_to_num(7.0), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Gated DeltaNet
# ---------------------------------------------------------------------------------------------------------
GDN_CASES = [  # (HV, Hk, V, K, T, mode, model dtype, config (BLOCK_V, warps, gram) or None, l2norm/scale, direct)
    (3, 1, 5, 7, 3, "fp32", torch.float32, (4, 1, True), (True, None), True),   # two V-tiles, the second partial
    (9, 3, 6, 12, 4, "dual_bf16", torch.float32, (8, 2, True), (True, None), False),  # 3 value heads per key head
    (3, 3, 5, 10, 1, "dual_fp8", torch.float32, (8, 2, True), (False, 0.3), True),  # HV = Hk, T = 1, no l2norm
    (5, 1, 12, 16, 4, "single_fp8", torch.bfloat16, None, (True, None), False),  # bf16 ring / activations, 1 launch
    # dot=True: S0 k_s / S0 q_s as one tf32x3 tl.dot (k and q columns side by side) over a [BLOCK_V, K]
    # tile (V, K not powers of two)
    (4, 2, 20, 24, 3, "fp32", torch.float32, (16, 2, True, None, True), (True, None), True),
    (2, 2, 16, 16, 4, "dual_fp8", torch.float32, (16, 1, True, None, True), (False, 0.3), False),
]


def gdn_problem(HV, Hk, V, K, T, mode, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    ck, lo = MODES[mode]
    c = gdn_replay_alloc(SLOTS, HV, V, K, Hk, L, dtype=dtype, ckpt_dtype=ck, lo_dtype=lo)
    fill_state(c, gen, (SLOTS, HV, V, K), mode, 0.3)
    poison_ring(c, [("ring_u", -0.5, 0.5), ("ring_k", -0.5, 0.5), ("ring_g", -0.5, 0.0)], T, gen)
    b = len(SLOT_IDS)
    kw = dict(q=torch.randn(b, T, Hk, K, generator=gen).to(dtype), k=torch.randn(b, T, Hk, K, generator=gen).to(dtype),
              v=torch.randn(b, T, HV, V, generator=gen).to(dtype), g=-torch.rand(b, T, HV, generator=gen) * 0.5,
              beta=torch.rand(b, T, HV, generator=gen), slot_ids=SLOT_IDS.clone())
    return c, kw


@pytest.mark.parametrize("HV,Hk,V,K,T,mode,dtype,config,qk,direct", GDN_CASES)
def test_gdn_verify_per_head_matches_ref(HV, Hk, V, K, T, mode, dtype, config, qk, direct, device):
    c, kw = gdn_problem(HV, Hk, V, K, T, mode, dtype, seed=HV * 100 + K + T)
    c = {k: v.to(device) for k, v in c.items()}
    kw = {k: v.to(device) for k, v in kw.items()}
    use_l2, scale = qk
    c0 = {k: v.clone() for k, v in c.items()}
    c_ref = {k: v.clone() for k, v in c.items()}
    if direct:  # straight into the launcher with a NaN-poisoned output: every element must be written
        o = torch.full_like(kw["v"], float("nan"))
        keys = ("q", "k", "v", "g", "beta", "slot_ids")
        gdn_launch_verify(c["ckpt"], c["ring_u"], c["ring_k"], c["ring_g"], c["write_pos"], *(kw[k] for k in keys), o,
                      L=L, scale=scale, use_qk_l2norm=use_l2, ckpt_scale=c.get("ckpt_scale"),
                      ckpt_lo=c.get("ckpt_lo"), ckpt_lo_scale=c.get("ckpt_lo_scale"), config=config)
    else:
        o = gdn_replay_verify(**c, **kw, L=L, scale=scale, use_qk_l2norm=use_l2, backend="triton",
                              plan=LaunchPlan(impl="per_head", config=config))
    o_ref = gdn_replay_verify(**c_ref, **kw, L=L, scale=scale, use_qk_l2norm=use_l2, backend="ref")
    assert o.dtype == dtype and not torch.isnan(o).any()
    assert torch.all(o[kw["slot_ids"] < 0] == 0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(o, o_ref) <= tol, rel(o, o_ref)
    ring_tol = 1e-5 if dtype == torch.float32 else 2**-7  # bf16 u / k: a last-bit fp32 difference may flip an ulp
    check_ring_and_untouched(c, c_ref, c0, {"ring_u": ring_tol, "ring_k": ring_tol, "ring_g": 0.0}, T)


@pytest.mark.parametrize("gram,l2", [(False, False), (True, True)])
def test_gdn_verify_per_head_matches_head_group(gram, l2, device):
    HV, Hk, V, K, T = 4, 2, 5, 7, 3
    c, kw = gdn_problem(HV, Hk, V, K, T, "fp32", torch.float32, seed=8)
    c = {k: v.to(device) for k, v in c.items()}
    kw = {k: v.to(device) for k, v in kw.items()}
    c1 = {k: v.clone() for k, v in c.items()}
    o2 = gdn_replay_verify(**c, **kw, L=L, use_qk_l2norm=l2, backend="triton",
                           plan=LaunchPlan(config=(8, 1, gram)))  # auto = per-head
    o1 = gdn_replay_verify(**c1, **kw, L=L, use_qk_l2norm=l2, backend="triton", plan=LaunchPlan(impl="head_group"))
    assert rel(o2, o1) <= 1e-5
    for k in c:
        torch.testing.assert_close(c[k].float().nan_to_num(7.0), c1[k].float().nan_to_num(7.0), rtol=1e-5, atol=1e-6)


def test_verify_impl_and_config_errors(device):
    c, kw = mamba_problem(3, 1, 5, 7, 1, "fp32", torch.float32, seed=1)
    c, kw = ({k: v.to(device) for k, v in d.items()} for d in (c, kw))
    with pytest.raises(ValueError, match=r"impl.*'auto', 'group', 'head_group', 'per_head'.*'v3'"):
        mamba2_replay_verify(**c, **kw, L=L, backend="ref", plan=LaunchPlan(impl="v3"))
    with pytest.raises(ValueError, match="BLOCK_P, num_warps"):
        mamba2_replay_verify(**c, **kw, L=L, backend="triton",
                             plan=LaunchPlan(impl="per_head", config=(8, 1, 4, None, 0)))
    c, kw = gdn_problem(3, 1, 5, 7, 1, "fp32", torch.float32, seed=1)
    c, kw = ({k: v.to(device) for k, v in d.items()} for d in (c, kw))
    with pytest.raises(ValueError, match=r"impl.*'auto', 'head_group', 'per_head'.*'fast'"):
        gdn_replay_verify(**c, **kw, L=L, backend="ref", plan=LaunchPlan(impl="fast"))
    with pytest.raises(ValueError, match="BLOCK_V, num_warps"):
        gdn_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(config=(8,)))
    with pytest.raises(ValueError, match="gram a bool"):  # a head-group config handed to per-head
        gdn_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(config=(16, 2, 2, None)))
    with pytest.raises(ValueError, match="dot=True needs gram=True"):
        gdn_replay_verify(**c, **kw, L=L, backend="triton", plan=LaunchPlan(config=(16, 2, False, None, True)))
