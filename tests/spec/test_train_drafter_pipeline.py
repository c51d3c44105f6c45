"""pipeline=train_drafter end to end at a tiny size: the drafter, metrics.csv and the plots are written, and the
exported copy loads as a drafter for the target (what spec.drafter=<dir> / auto read)."""
import torch
from synodic.pipelines.train_drafter import run

from synodic.config.compose import compose
from synodic.models.weights import shipped_dir
from synodic.spec.models import load_draft_model


def test_train_drafter_writes_a_loadable_drafter(tmp_path):
    export = tmp_path / "shipped"
    cfg = compose(["runtime.device=cpu", "pipeline=train_drafter", "spec=dflash", "model=tiny_gdn",
                   "pipeline.steps=3", "pipeline.prompts=4", "pipeline.new_tokens=12", "pipeline.eval_prompts=2",
                   "pipeline.batch=2", "pipeline.num_layers=1", "pipeline.device=cpu", f"pipeline.export_to={export}"])
    out = run(cfg, tmp_path)
    assert 1.0 <= out["metrics"]["acceptance_length"] <= 8.0
    assert len(out["metrics"]["rate_by_position"]) == 7
    for f in ("metrics.csv", "loss.png", "acceptance.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 4  # header + one row per step
    from synodic.models.weights import load_checkpoint
    target = load_checkpoint(shipped_dir("tiny_gdn"), "cpu", torch.float32)
    d = load_draft_model(export, target.config, target=target)
    assert d.scheme == "dflash"
