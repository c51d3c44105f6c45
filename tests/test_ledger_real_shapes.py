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
