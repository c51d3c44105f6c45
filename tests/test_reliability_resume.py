"""Resume and model choices that do not match: a training checkpoint of another architecture is one
line naming both; model=X with model.weights of another architecture and overrides that drop the
shipped weights print a note; batch_size=null is resolved by device and recorded as used; the training
memory estimate refuses, naming pipeline.batch_size, what does not fit."""
import pytest
import torch

from synodic.config import ConfigError
from synodic.config.compose import compose
from synodic.data.corpus import EOT, load_heldout
from synodic.models.config import HybridConfig
from synodic.models.presets import PRESETS
from synodic.train.config import TrainPipeline
from synodic.train.state import load_state, resume_conflicts
from synodic.train.trainer import train

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "mamba_num_heads": 2, "mamba_head_dim": 16, "ssm_state_size": 16,
        "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "chunk_size": 16}
MODELS = "synodic/assets/models"


def _arch(preset, **kw):
    return HybridConfig.model_validate({**PRESETS[preset].model_dump(), **TINY, **kw})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(load_heldout().split(EOT)[1:7]):
        (d / f"doc{i:02d}.py").write_text(doc[:4000])
    return d


def _settings(corpus, **kw):
    base = dict(data=[str(corpus)], seq_len=32, max_steps=2, warmup_steps=1, eval_every=100, eval_tokens=64,
                ckpt_every=100, log_every=1, device="cpu", final_eval=False, scan_chunk=None)
    return TrainPipeline(**{**base, **kw})


def test_other_architecture_checkpoint_is_one_line(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    res = train(_settings(corpus), tmp_path / "r", _arch("tiny_mamba2"), quiet=True)
    st = load_state(tmp_path / "r" / "checkpoint")
    assert st["settings"]["batch_size"] == 4 and res["train"]["batch_size"] == 4  # null -> the CPU's 4, recorded
    with pytest.raises(ConfigError) as e:
        train(_settings(corpus), tmp_path / "r", _arch("tiny_gdn"), quiet=True)
    model_lines = [ln for ln in e.value.lines if ln.startswith("model")]
    assert len(model_lines) == 1 and "nemotron_h" in model_lines[0] and "qwen3_next" in model_lines[0]
    assert "another architecture" in model_lines[0]


def test_preset_names_in_the_architecture_line():
    a, b = PRESETS["tiny_mamba2"].model_dump(mode="json"), PRESETS["tiny_gdn"].model_dump(mode="json")
    (line,) = resume_conflicts({}, {}, a, {**b, "vocab_size": 999}, 0)
    assert line.startswith("model=tiny_gdn: the checkpoint holds a tiny_mamba2 model")
    lines = resume_conflicts({"seq_len": 32, "max_steps": 2}, {"seq_len": 64, "max_steps": 1}, a, a, 2)
    assert lines == ["pipeline.seq_len=64: the checkpoint was trained with 32",
                     "pipeline.max_steps=1: the checkpoint is already at step 2"]


def test_weights_of_another_architecture_and_random_overrides_print_notes(capsys):
    from synodic.config import files
    files._NOTED.clear()
    cfg = compose(["model=tiny_gdn", f"model.weights={MODELS}/tiny_mamba2", "runtime.device=cpu"])
    files.architecture_note(cfg.model)
    err = capsys.readouterr().err
    assert err.count("note: ") == 1 and "model=tiny_gdn" in err and "nemotron_h" in err
    files.architecture_note(compose(["model=tiny_mamba2", f"model.weights={MODELS}/tiny_mamba2"]).model)
    assert capsys.readouterr().err == ""  # the matching architecture: nothing to say
    compose(["model=tiny_mamba2", "+model.overrides.hidden_size=256"]).model.architecture()
    assert "using seeded random weights" in capsys.readouterr().err


def test_train_memory_estimate_refuses_naming_batch_size(monkeypatch):
    from synodic.config import budget
    monkeypatch.setattr(budget, "available_bytes", lambda device: 3 * budget.GiB)
    cfg = compose(["pipeline=train", "pipeline.device=cpu", "pipeline.batch_size=32", "pipeline.seq_len=512"])
    est = budget.estimate(cfg)
    assert est["activations"][0] == "pipeline.batch_size" and est["activations"][1] > 4 * budget.GiB
    with pytest.raises(ConfigError) as e:
        budget.check_fits(cfg, torch.device("cpu"))
    (line,) = e.value.lines
    assert line.startswith("pipeline.batch_size=32:") and "activations" in line and "3.0 GiB" in line
    small = compose(["pipeline=train", "pipeline.device=cpu", "pipeline.seq_len=512"])  # batch null: 4 on CPU
    budget.check_fits(small, torch.device("cpu"))


def test_activation_trace_scales_with_tokens():
    from synodic.config import budget
    a = HybridConfig.model_validate({**PRESETS["tiny_mamba2"].model_dump()})
    one = budget.train_activation_bytes(a, 256, 1, 128, False)
    assert budget.train_activation_bytes(a, 256, 4, 128, False) == pytest.approx(4 * one, rel=1e-6)
    assert budget.train_activation_bytes(a, 256, 4, 128, True) < 4 * one  # bf16 autocast: smaller
    # beyond 512 tokens the quadratic fit; it is close to an exact trace at 1024
    fit = budget.train_activation_bytes(a, 1024, 1, 128, False)
    exact = budget._saved_bytes(a, 1024, 128) + 1024 * a.vocab_size * 4
    assert fit == pytest.approx(exact, rel=0.05)
