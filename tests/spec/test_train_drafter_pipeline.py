"""pipeline=train_drafter end to end at a tiny size: the drafter, metrics.csv and the plots are written, greedy and
sampled acceptance are reported, the exported (fp8) copy loads as a drafter for the target (what
spec.drafter=<dir> / auto read), and a re-run in the same run directory resumes from its checkpoint."""
import torch
from synodic.pipelines.train_drafter import run

from synodic.config.compose import compose
from synodic.models.weights import shipped_dir
from synodic.spec.models import load_draft_model


def test_train_drafter_writes_a_loadable_drafter_and_resumes(tmp_path, capsys):
    export = tmp_path / "shipped"
    cfg = compose(["runtime.device=cpu", "pipeline=train_drafter", "spec=dspark", "model=tiny_gdn",
                   "pipeline.steps=3", "pipeline.prompts=4", "pipeline.new_tokens=12", "pipeline.eval_prompts=2",
                   "pipeline.batch=2", "pipeline.anchors_per_seq=4", "pipeline.num_layers=1",
                   "pipeline.intermediate_size=64", "pipeline.head_rank=16", "pipeline.sampled_fraction=0.5",
                   "pipeline.device=cpu", "pipeline.ckpt_every=1", f"pipeline.export_to={export}"])
    out = run(cfg, tmp_path)
    m = out["metrics"]
    assert 1.0 <= m["acceptance_length"] <= 8.0 and 1.0 <= m["sampled_acceptance_length"] <= 8.0
    assert len(m["rate_by_position"]) == 7 and len(m["sampled_rate_by_position"]) == 7
    assert 1.0 <= m["walk_tokens_per_step"] <= 8.0 and m["walk_max_tokens"] == 12 - 7 + 1
    assert m["walk_steps"] >= 2 * m["walk_max_tokens"] / 8  # two held-out prompts, at most 8 tokens a step
    for f in ("metrics.csv", "loss.png", "acceptance.png", "ckpt/state.json", "ckpt/state.safetensors"):
        assert (tmp_path / f).stat().st_size > 0
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 4  # header + one row per step
    from synodic.models.weights import load_checkpoint
    target = load_checkpoint(shipped_dir("tiny_gdn"), "cpu", torch.float32)
    d = load_draft_model(export, target.config, target=target)
    assert d.scheme == "dspark" and d.config.lookup_hint == 4
    assert not torch.equal(d.confidence.temperature, torch.ones(7))  # calibrated per position
    capsys.readouterr()
    again = run(cfg, tmp_path)  # the finished checkpoint: nothing left to train, same drafter and numbers
    assert "resuming from" in capsys.readouterr().out
    assert again["metrics"]["final_loss"] == m["final_loss"]
    assert again["metrics"]["acceptance_length"] == m["acceptance_length"]


def test_unwritable_export_dir_is_refused_before_training(tmp_path):
    """pipeline.export_to is checked when the config is composed, in one line: before the target continues a
    single prompt (training data, then training, would otherwise run to the end and fail there)."""
    import pytest

    from synodic.config.errors import ConfigError
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file" / "sub", "/proc/nope"):  # a file on the way; a place root may not create in
        with pytest.raises(ConfigError) as e:
            compose(["pipeline=train_drafter", "spec=dflash2", f"pipeline.export_to={bad}"])
        assert len(e.value.lines) == 1 and e.value.lines[0].startswith("pipeline.export_to="), e.value.lines
