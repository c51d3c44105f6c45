"""A split per-head decode step with its flush launch on the side stream (overlap=True) vs in order (overlap=False):
the two launches touch disjoint rows, so outputs, checkpoints and rings must match bit for bit, eagerly and in a
captured CUDA graph (the fork / join the engine's graphs record). GPU only: the interpreter has no streams."""
from __future__ import annotations

import pytest
import torch
from replay_fixtures import MODES, fill_state
from synodic.kernels.gdn_replay import gdn_replay_alloc, gdn_replay_decode, replay_advance
from synodic.kernels.mamba2_replay import mamba2_replay_alloc, mamba2_replay_decode
from synodic.kernels.replay_common import LaunchPlan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (streams)")

L = 4
SLOTS = 12


def _gdn(gen, mode):
    HV, Hk, V, K = 6, 3, 40, 64
    ck, lo = MODES[mode]
    c = gdn_replay_alloc(SLOTS, HV, V, K, Hk, L, dtype=torch.bfloat16, device="cuda", ckpt_dtype=ck, lo_dtype=lo)
    fill_state(c, torch.Generator().manual_seed(4), (SLOTS, HV, V, K), mode, 0.3)

    def inputs(b):
        return dict(q=torch.randn(b, Hk, K, generator=gen, device="cuda").bfloat16(),
                    k=torch.randn(b, Hk, K, generator=gen, device="cuda").bfloat16(),
                    v=torch.randn(b, HV, V, generator=gen, device="cuda").bfloat16(),
                    g=-torch.rand(b, HV, generator=gen, device="cuda") * 0.5,
                    beta=torch.rand(b, HV, generator=gen, device="cuda"))

    def step(cache, kw, overlap):
        return gdn_replay_decode(**cache, **kw, L=L, advance=False, backend="triton",
                                 plan=LaunchPlan(impl="per_head", split=True, overlap=overlap))
    return c, inputs, step


def _mamba2(gen, mode):
    H, G, P, N = 6, 2, 40, 64
    ck, lo = MODES[mode]
    c = mamba2_replay_alloc(SLOTS, H, P, N, G, L, dtype=torch.bfloat16, device="cuda", ckpt_dtype=ck, lo_dtype=lo)
    fill_state(c, torch.Generator().manual_seed(4), (SLOTS, H, P, N), mode, 0.3)
    A = -(torch.rand(H, generator=gen, device="cuda") + 0.3)
    D, bias = torch.randn(H, generator=gen, device="cuda"), torch.randn(H, generator=gen, device="cuda") * 0.5

    def inputs(b):
        return dict(x=torch.randn(b, H, P, generator=gen, device="cuda").bfloat16(),
                    dt=torch.randn(b, H, generator=gen, device="cuda"),
                    B=torch.randn(b, G, N, generator=gen, device="cuda").bfloat16(),
                    C=torch.randn(b, G, N, generator=gen, device="cuda").bfloat16(),
                    z=torch.randn(b, H, P, generator=gen, device="cuda").bfloat16())

    def step(cache, kw, overlap):
        sid = kw["slot_ids"]
        row_wp = torch.where(sid >= 0, cache["write_pos"][sid.clamp(min=0).long()], 0).to(torch.int32)
        return mamba2_replay_decode(**cache, **kw, A=A, D=D, dt_bias=bias, L=L, advance=False, backend="triton",
                                    row_wp=row_wp,
                                    plan=LaunchPlan(impl="per_head", split=True, overlap=overlap))
    return c, inputs, step


@pytest.mark.parametrize("kind", ["gdn", "mamba2"])
@pytest.mark.parametrize("mode", ["fp32", "dual_bf16"])
def test_overlapped_flush_matches_in_order(kind, mode):
    gen = torch.Generator(device="cuda").manual_seed(3)
    c, inputs, step = (_gdn if kind == "gdn" else _mamba2)(gen, mode)
    c_ord = {k: v.clone() for k, v in c.items()}
    # staggered cursors: every step some rows flush and the others append; one padding row
    c["write_pos"].copy_(torch.arange(SLOTS, device="cuda", dtype=torch.int32) % L)
    c_ord["write_pos"].copy_(c["write_pos"])
    sid = torch.tensor([3, 0, -1, 5, 1, 2, 11, 7, 8], dtype=torch.int32, device="cuda")
    for _ in range(2 * L + 1):
        kw = dict(inputs(len(sid)), slot_ids=sid)
        o = step(c, kw, True)
        o_ord = step(c_ord, kw, False)
        torch.cuda.synchronize()
        assert torch.equal(o, o_ord)
        for key in c:
            assert torch.equal(c[key], c_ord[key]), key
        replay_advance(c["write_pos"], sid, L=L)
        replay_advance(c_ord["write_pos"], sid, L=L)

    # the same step captured in a CUDA graph (fork to the side stream, join) and replayed over a full cycle
    kw = dict(inputs(len(sid)), slot_ids=sid)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile) outside the capture, on copies
        warm = {k: v.clone() for k, v in c.items()}
        step(warm, kw, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = step(c, kw, True)
        replay_advance(c["write_pos"], sid, L=L)
    for _ in range(L + 1):
        graph.replay()
        o_ord = step(c_ord, kw, False)
        replay_advance(c_ord["write_pos"], sid, L=L)
        torch.cuda.synchronize()
        assert torch.equal(o_g, o_ord)
        for key in c:
            assert torch.equal(c[key], c_ord[key]), key
