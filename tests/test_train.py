"""A few CPU training steps on a tiny config: the loss falls, an interrupted run resumes on the same
curve, the schedule has its shape, the exported model loads."""
import pytest
import torch

from synodic.data.corpus import EOT, load_heldout
from synodic.models.config import HybridConfig
from synodic.models.presets import PRESETS
from synodic.models.weights import load_checkpoint
from synodic.train.config import TrainPipeline
from synodic.train.state import load_state
from synodic.train.trainer import lr_at, measure_window, train

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "mamba_num_heads": 2, "mamba_head_dim": 16, "ssm_state_size": 16,
        "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "chunk_size": 16}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Twelve documents of the shipped shard as a user corpus (in the repo, the same everywhere)."""
    d = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(load_heldout().split(EOT)[1:13]):
        (d / f"doc{i:02d}.py").write_text(doc[:6000])
    return d


def _settings(corpus, **kw):
    base = dict(data=[str(corpus)], seq_len=32, batch_size=4, max_steps=30, warmup_steps=3, lr=1e-2,
                eval_every=10, eval_tokens=256, ckpt_every=10, log_every=5, device="cpu",
                final_eval=False, scan_chunk=None)
    return TrainPipeline(**{**base, **kw})


def _arch(preset):
    return HybridConfig.model_validate({**PRESETS[preset].model_dump(), **TINY})


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
def test_few_steps_reduce_loss(preset, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    res = train(_settings(corpus), tmp_path / "run", _arch(preset), quiet=True)
    rows = load_state(tmp_path / "run" / "checkpoint")["history"]
    first = sum(r["train_loss"] for r in rows[:5]) / 5
    last = sum(r["train_loss"] for r in rows[-5:]) / 5
    assert last < first - 1.0, (first, last)
    ev = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
    assert len(ev) == 3 and ev[-1] < ev[0]
    assert res["metrics"]["steps"] == 30
    for f in ("metrics.csv", "loss.png", "model/config.json", "model/model.safetensors", "model/tokenizer.json"):
        assert (tmp_path / "run" / f).is_file(), f
    m = load_checkpoint(tmp_path / "run" / "model")
    assert m.config.hidden_size == 32
    assert m.embed_tokens.weight.dtype == torch.float32          # loads as fp32 from bf16 matrices


def test_resume_continues_the_same_curve(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    arch = _arch("tiny_gdn")
    kw = dict(max_steps=8, ckpt_every=100, eval_every=4, save_dtype="fp32")
    straight = train(_settings(corpus, **kw), tmp_path / "a", arch, quiet=True)
    halted = train(_settings(corpus, halt_at_step=5, **kw), tmp_path / "b", arch, quiet=True)
    assert halted["halted"] and halted["metrics"]["steps"] == 5
    resumed = train(_settings(corpus, **kw), tmp_path / "b", arch, quiet=True)
    assert resumed["metrics"]["steps"] == straight["metrics"]["steps"] == 8

    def hist(d):
        return load_state(d / "checkpoint")["history"]
    ha, hb = hist(tmp_path / "a"), hist(tmp_path / "b")
    assert [r["step"] for r in hb] == list(range(1, 9))
    for ra, rb in zip(ha, hb):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-6)
        assert ra["lr"] == rb["lr"]
    wa = load_checkpoint(tmp_path / "a" / "model").state_dict()
    wb = load_checkpoint(tmp_path / "b" / "model").state_dict()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_schedule_shape():
    s = TrainPipeline(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, 100, s) == pytest.approx(0.1) and lr_at(9, 100, s) == pytest.approx(1.0)
    assert lr_at(10, 100, s) == pytest.approx(1.0) and lr_at(100, 100, s) == pytest.approx(0.1)
    assert lr_at(55, 100, s) == pytest.approx(0.55)
    # the step time is measured inside the warm-up, where the LR does not depend on max_steps
    m0, m1 = measure_window(100)
    assert 0 < m0 < m1 < 100
    s2 = TrainPipeline(lr=1.0, warmup_steps=100)
    assert all(lr_at(k, 10 ** 9, s2) == lr_at(k, 1220, s2) for k in range(m1 + 1))


class _Payload:
    """Unpickling this calls os.system: a planted checkpoint that would run code."""
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_pickle_payload_in_run_dir_never_runs(corpus, tmp_path, monkeypatch):
    from synodic.config.errors import ConfigError
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    marker = tmp_path / "pwned"
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    torch.save({"model": _Payload(marker)}, tmp_path / "run" / "checkpoint" / "state.pt")
    with pytest.raises(ConfigError, match="pickle"):
        train(_settings(corpus, max_steps=2), tmp_path / "run", _arch("tiny_mamba2"), quiet=True)
    assert not marker.exists()
    # A pickle renamed to the new name is not loadable either: safetensors / JSON parse, nothing runs.
    import shutil
    shutil.move(tmp_path / "run" / "checkpoint" / "state.pt", tmp_path / "run" / "checkpoint" / "state.safetensors")
    (tmp_path / "run" / "checkpoint" / "state.json").write_text('{"__tensor__": "x"}')
    with pytest.raises(ConfigError, match="damaged checkpoint"):
        train(_settings(corpus, max_steps=2), tmp_path / "run", _arch("tiny_mamba2"), quiet=True)
    assert not marker.exists()


def test_resume_refuses_changed_settings_and_takes_more_steps(corpus, tmp_path, monkeypatch):
    from synodic.config.errors import ConfigError
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    arch = _arch("tiny_mamba2")
    kw = dict(max_steps=4, ckpt_every=100, eval_every=100)
    train(_settings(corpus, **kw), tmp_path / "r", arch, quiet=True)
    with pytest.raises(ConfigError) as e:
        train(_settings(corpus, **{**kw, "seq_len": 16, "lr": 1e-3}), tmp_path / "r", arch, quiet=True)
    assert any(x.startswith("pipeline.seq_len=16") for x in e.value.lines)
    assert any(x.startswith("pipeline.lr=0.001") for x in e.value.lines)
    other = HybridConfig.model_validate({**arch.model_dump(), "hidden_size": 48})
    with pytest.raises(ConfigError, match="model.hidden_size=48"):
        train(_settings(corpus, **kw), tmp_path / "r", other, quiet=True)
    more = train(_settings(corpus, **{**kw, "max_steps": 6}), tmp_path / "r", arch, quiet=True)
    assert more["metrics"]["steps"] == 6 and more["metrics"]["max_steps"] == 6


def test_state_roundtrip_keeps_types(tmp_path):
    from synodic.train.state import save_state
    st = {"a": (1, 2.5), "opt": {0: {"m": torch.arange(3.0)}, 1: {}}, "h": [{"x": None}], "t": torch.ones(2, 2)}
    save_state(st, tmp_path)
    back = load_state(tmp_path)
    assert back["a"] == (1, 2.5) and list(back["opt"]) == [0, 1] and back["h"] == [{"x": None}]
    assert torch.equal(back["opt"][0]["m"], torch.arange(3.0)) and torch.equal(back["t"], torch.ones(2, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.safetensors"]
