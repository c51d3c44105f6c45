"""The ledger at the real-shape presets (built on the meta device: shapes only, no memory): replay
moves >= 1.75x fewer SSM bytes per token than eager over a full ring cycle."""
import pytest
import torch

from synodic.models.lm import HybridLM
from synodic.models.presets import PRESETS
from synodic.ssm.config import EagerSSM, ReplaySSM
from synodic.ssm.eager import EagerStateBackend
from synodic.ssm.replay import ReplayStateBackend


def _per_token(backend, steps):
    total = 0
    for _ in range(steps):
        b = backend.step_bytes([0])
        total += b["ssm_state_read"] + b["ssm_state_write"] + b["ssm_ring"]
    return total / steps


@pytest.mark.parametrize("preset", ["nemotron_h_8b", "qwen35_gdn_4b"])
def test_replay_ssm_bytes_at_real_shapes(preset):
    with torch.device("meta"):
        model = HybridLM(PRESETS[preset]).to(torch.bfloat16)
    eager = EagerStateBackend(model, 1, "meta", EagerSSM())
    replay = ReplayStateBackend(model, 1, "meta", ReplaySSM())
    ratio = _per_token(eager, 16) / _per_token(replay, 16)
    assert ratio >= 1.75, ratio
    dual = ReplayStateBackend(model, 1, "meta", ReplaySSM(precision="dual_bf16"))
    assert _per_token(eager, 16) / _per_token(dual, 16) >= 2.5


def _row_layer_bytes(backend, wp: int, T: int, plain: bool) -> tuple[int, int, int, int]:
    """The ledger written out per layer from the cache tensors: (read, write, ring, next cursor) of one row."""
    L, read, write, ring = backend.L, 0, 0, 0
    for c in backend.cache:
        def row(name, c=c):
            t = c.get(name)
            return 0 if t is None else t[0].numel() * t.element_size()
        entry = sum(row(n) // L for n in c if n.startswith("ring_"))
        ck, lo = row("ckpt") + row("ckpt_scale"), row("ckpt_lo") + row("ckpt_lo_scale")
        flush = wp >= L - 1 if plain else (wp > 0 and wp + T > L)
        read += (ck if flush else 0) + (0 if (plain and flush) else (lo or ck))
        write += ck + lo if flush else 0
        ring += wp * entry + (0 if (plain and flush) else T * entry)
    return read, write, ring, 0 if flush else wp


@pytest.mark.parametrize("preset,precision", [("nemotron_h_8b", "fp32"), ("qwen35_gdn_4b", "dual_fp8"),
                                              ("tiny_gdn", "single_bf16")])
def test_replay_ledger_matches_per_layer_sums(preset, precision):
    """Random cursors, plain steps and verify windows: the summed-constant ledger equals the per-layer sums."""
    with torch.device("meta"):
        model = HybridLM(PRESETS[preset]).to(torch.bfloat16)
    be = ReplayStateBackend(model, 9, "meta", ReplaySSM(precision=precision))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        T = int(torch.randint(1, 6, (1,), generator=gen))
        slots = torch.randperm(9, generator=gen)[: int(torch.randint(1, 10, (1,), generator=gen))].tolist()
        wp0 = torch.randint(0, be.L, (9,), generator=gen)
        be.host_wp[:] = wp0.numpy()
        acc = torch.randint(1, T + 1, (len(slots),), generator=gen).tolist()
        plain = T == 1 and bool(torch.randint(0, 2, (1,), generator=gen))  # else a window (of one token, maybe)
        got = be.step_bytes(slots) if plain else be.step_bytes(slots, T, acc)
        assert (be.host_wp == wp0.numpy()).all()  # a query: the mirror moves in host_step only
        be.host_step(slots, T, None if plain else acc)
        want = [0, 0, 0]
        for j, s in enumerate(slots):
            r, w, g, base = _row_layer_bytes(be, int(wp0[s]), T, plain)
            want = [want[0] + r, want[1] + w, want[2] + g]
            wp = int(wp0[s])
            nxt = (0 if wp >= be.L - 1 else wp + 1) if plain else min(be.L, base + acc[j])
            assert be.host_wp[s] == nxt
        assert [got["ssm_state_read"], got["ssm_state_write"], got["ssm_ring"]] == want
        assert all(be.host_wp[s] == wp0[s] for s in range(9) if s not in slots)
