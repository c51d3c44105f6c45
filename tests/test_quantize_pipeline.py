"""pipeline=quantize: per-group parts written atomically, a killed job resumes at the next unfinished
group, the merged checkpoint + manifest, quant=<format> loading it (same outputs as quantizing on the
fly), the Ray executor (one small run), and the pipeline's run() through the config system."""
import json

import pytest
import torch
from synodic.pipelines.quantize import quantize_to_store

from synodic.config import ConfigError
from synodic.config.compose import compose
from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.quant import QuantLinear, store
from synodic.quant.apply import apply_quant, artifact_hash, model_identity
from synodic.quant.config import BlockQuant

LAYERS = ["blocks.0.*", "blocks.1.*", "blocks.3.*"]  # mamba2, mlp, attention: 3 groups, 8 linears


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(tmp_path / "store"))
    return tmp_path / "store"


def tiny():
    return random_model(PRESETS["tiny_mamba2"], 0)


class Killed(Exception):
    pass


def test_resume_after_kill_then_decode_loads_the_artifact(root):
    q = BlockQuant(kind="nvfp4", iters=2, layers=LAYERS)
    model = tiny()
    seen = []

    def die_after_first(group, stats):
        seen.append(group)
        raise Killed

    with pytest.raises(Killed):
        quantize_to_store(model, q, executor="inline", progress=False, on_group_done=die_after_first)
    adir = root / artifact_hash(model_identity(model), q)
    assert store.done_groups(adir) == {"blocks.0"} and not (adir / store.MANIFEST).exists()
    assert not list(adir.rglob(".*tmp*"))  # only complete files, under their final names

    res = quantize_to_store(model, q, executor="inline", progress=False)
    assert (res["computed_groups"], res["resumed_groups"]) == (2, 1)
    man = json.loads((adir / store.MANIFEST).read_text())
    assert man["format"] == "nvfp4" and man["method"] == "dualquant" and man["groups"] == ["blocks.0", "blocks.1",
                                                                                            "blocks.3"]
    assert len(man["layers"]) == 8 and all(0 < v["rel_mse"] < 0.03 for v in man["layers"].values())
    assert man["bytes"]["packed"] < man["bytes"]["dense"] / 6 and not (adir / store.PARTS).exists()
    again = quantize_to_store(model, q, executor="inline", progress=False)
    assert again["already_complete"] and again["computed_groups"] == 0

    a, b = tiny(), tiny()
    sa = apply_quant(a, q)  # artifact=auto finds it
    sb = apply_quant(b, q.model_copy(update={"artifact": "none"}))
    assert sa.source == "artifact" and sa.artifact == str(adir) and sb.source == "on_the_fly"
    assert sa.rel_mse == pytest.approx(sb.rel_mse, rel=1e-6)
    x = torch.randint(0, 4096, (2, 7))
    assert torch.equal(a(x), b(x))
    assert isinstance(a.blocks[3].mixer.q_proj, QuantLinear) and not isinstance(a.blocks[2].mixer.in_proj, QuantLinear)


def test_artifact_is_keyed_by_weights_and_config(root):
    q = BlockQuant(kind="mxfp4", method="rtn", layers=["blocks.1.*"])
    model = tiny()
    res = quantize_to_store(model, q, executor="inline", progress=False)
    h = res["hash"]
    assert artifact_hash(model_identity(model), q.model_copy(update={"mode": "w4a4", "backend": "torch"})) == h
    assert artifact_hash(model_identity(model), q.model_copy(update={"method": "dualquant"})) != h
    other = random_model(PRESETS["tiny_mamba2"], 1)
    assert artifact_hash(model_identity(other), q) != h
    with pytest.raises(ConfigError, match="made for another model"):
        apply_quant(other, q.model_copy(update={"artifact": res["artifact"]}))


def test_ray_executor_small_run(tmp_path):
    q = BlockQuant(kind="mxfp4", method="rtn", layers=["blocks.0.*", "blocks.1.*"])
    res = quantize_to_store(tiny(), q, tmp_path, executor="ray", workers=2, progress=False)
    assert res["computed_groups"] == 2 and store.is_complete(res["artifact"])
    assert len(res["layers"]) == 4


def test_pipeline_run_through_config(root, tmp_path):
    from synodic.pipelines.quantize import run
    cfg = compose(["pipeline=quantize", "quant=mxfp4", "quant.method=rtn", "pipeline.executor=inline",
                   "quant.layers=[blocks.1.*]", "runtime.device=cpu"])
    out = run(cfg, tmp_path)
    assert out["metrics"]["layers"] == 2 and out["metrics"]["computed_groups"] == 1
    assert (tmp_path / "quant_error.png").is_file() and store.is_complete(out["artifact"])
    with pytest.raises(ConfigError, match="expected quant=<format>"):
        run(compose(["pipeline=quantize", "runtime.device=cpu"]), tmp_path)
