"""Runs that cannot fit are refused before anything is allocated, naming the key that asks the most."""
import pytest
import torch

from synodic.config import budget
from synodic.config.compose import compose
from synodic.config.errors import ConfigError


@pytest.fixture(autouse=True)
def small_machine(monkeypatch):
    monkeypatch.setattr(budget, "available_bytes", lambda device: 24 * budget.GiB)


@pytest.mark.parametrize("override,key", [("runtime.max_slots=100000", "runtime.max_slots=100000"),
                                          ("kv.num_blocks=100000000", "kv.num_blocks=100000000"),
                                          ("workload.max_tokens=1000000000", "workload.max_tokens=1000000000"),
                                          ("model=nemotron_h_8b", "model='nemotron_h_8b'")])
def test_too_big_is_refused_naming_the_key(override, key):
    cfg = compose(["runtime.device=cpu", override, *(["runtime.max_slots=64"] if "8b" in override else [])])
    with pytest.raises(ConfigError) as e:
        budget.check_fits(cfg, torch.device("cpu"), fraction=0.5)
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(key) and "GiB" in e.value.lines[0]


def test_defaults_fit():
    budget.check_fits(compose(["runtime.device=cpu"]), torch.device("cpu"))


def test_model_estimate_matches_the_built_model():
    from synodic.models.presets import PRESETS
    from synodic.models.weights import random_model
    arch = PRESETS["tiny_mamba2"]
    assert budget.n_params(arch) == sum(p.numel() for p in random_model(arch, 0).parameters())
