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
                                          ("model=nemotron_h_8b", "model='nemotron_h_8b'"),
                                          ("pipeline.max_tokens=1000000000", "pipeline.max_tokens=1000000000")])
def test_too_big_is_refused_naming_the_key(override, key):
    cfg = compose(["runtime.device=cpu", override, *(["runtime.max_slots=64"] if "8b" in override else []),
                   *(["pipeline=eval"] if override.startswith("pipeline.") else [])])
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


def test_big_random_model_is_built_in_its_dtype(monkeypatch):
    """Above the small-model threshold no fp32 weight matrix is ever created (it would double an 8B model)."""
    from synodic.models import weights
    from synodic.models.config import HybridConfig
    from synodic.models.presets import PRESETS
    arch = HybridConfig.model_validate({**PRESETS["tiny_mamba2"].model_dump(), "hidden_size": 1024,
                                        "intermediate_size": 4096, "vocab_size": 16384})
    assert budget.n_params(arch) > 50_000_000
    made = []
    orig = torch.nn.Parameter.__new__

    def spy(cls, data=None, requires_grad=True):
        if data is not None and data.device.type != "meta":   # the size probe builds on meta
            made.append((data.dtype, data.dim()))
        return orig(cls, data, requires_grad)
    monkeypatch.setattr(torch.nn.Parameter, "__new__", spy)
    m = weights.random_model(arch, 0, "cpu", torch.bfloat16)
    # the matrices (all the memory) are bf16 from the start; 1-D vectors may start fp32
    assert made and not [m for m in made if m and m[0] == torch.float32 and m[1] >= 2]
    assert next(m.parameters()).dtype == torch.bfloat16


def test_unreachable_ray_address_is_found_in_seconds():
    import time

    from synodic.config.netcheck import unreachable
    t = time.perf_counter()
    assert "nothing accepts connections" in unreachable("127.0.0.1:1", timeout_s=2)
    assert time.perf_counter() - t < 5
    assert unreachable("auto") is None


def test_train_drafter_batch_that_cannot_fit_is_refused_and_the_default_fits():
    base = ["pipeline=train_drafter", "spec=dflash", "pipeline.device=cpu"]
    budget.check_fits(compose(base), torch.device("cpu"))
    with pytest.raises(ConfigError) as e:
        budget.check_fits(compose([*base, "pipeline.batch=20000"]), torch.device("cpu"))
    line = e.value.lines[0]
    assert len(e.value.lines) == 1 and line.startswith("pipeline.batch=20000") and "drafter logits" in line


def test_local_cpu_replicas_are_bounded_by_the_machine():
    """runtime=ray on a local instance: each CPU replica is a process with its own model, so 1000 of them are
    refused (naming how many fit) before Ray starts any; a cluster address or a few replicas pass."""
    over = ["runtime=ray", "runtime.device=cpu"]
    budget.check_fits(compose([*over, "runtime.replicas=4"]), torch.device("cpu"))
    budget.check_fits(compose([*over, "runtime.replicas=1000", "runtime.address=10.0.0.1:6379"]), torch.device("cpu"))
    with pytest.raises(ConfigError) as e:
        budget.check_fits(compose([*over, "runtime.replicas=1000"]), torch.device("cpu"))
    line = e.value.lines[0]
    assert len(e.value.lines) == 1 and line.startswith("runtime.replicas=1000:")
    assert "expected runtime.replicas <=" in line
    fit = int(line.split("expected runtime.replicas <= ")[1].split()[0])
    assert 4 <= fit < 1000
    budget.check_fits(compose([*over, f"runtime.replicas={fit}"]), torch.device("cpu"))


def test_train_drafter_estimate_names_the_long_prompt_not_the_batch():
    cfg = compose(["pipeline=train_drafter", "spec=dflash", "pipeline.batch=2", "pipeline.prompt_len=1000000",
                   "pipeline.device=cpu", "runtime.device=cpu"])
    with pytest.raises(ConfigError) as e:
        budget.check_fits(cfg, torch.device("cpu"))
    assert e.value.lines[0].startswith("pipeline.prompt_len=1000000:"), e.value.lines


@pytest.mark.parametrize("over,key", [(["kv=adaptive", "kv.index_num_blocks=100000000"], "kv.index_num_blocks="),
                                      (["kv=hisparse", "kv.top_k=1000000", "runtime.max_slots=4096"], "kv.top_k=")])
def test_host_tiered_tables_are_counted(over, key):
    """The hot-buffer and indexer tables of kv=hisparse / adaptive were allocation tracebacks mid-build."""
    with pytest.raises(ConfigError) as e:
        budget.check_fits(compose(["runtime.device=cpu", *over]), torch.device("cpu"))
    assert e.value.lines[0].startswith(key), e.value.lines
