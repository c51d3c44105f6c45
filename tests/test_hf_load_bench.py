"""benchmarks/hf_load.py at a tiny size: it writes a Hub-style NemotronH folder synodic loads (and whose
values equal the shards'), and reports both timings."""
import json

import torch

from benchmarks import hf_load


def test_hf_load_tiny(tmp_path):
    out = tmp_path / "r.json"
    res = hf_load.main(["--dir", str(tmp_path / "f"), "--out", str(out), "--preset", "tiny_mamba2", "--layers", "4",
                        "--shard-gb", "0.002", "--device", "cpu", "--reps", "1"])
    assert json.loads(out.read_text()) == res
    assert res["shards"] > 1 and res["layers"] == 4 and res["synodic_load_s"] > 0 and res["safetensors_read_s"] > 0
    assert 0 <= res["load_host_anon_gib"] < 0.25  # a few MB of tensors: the child's peak is near its baseline
    from safetensors.torch import load_file

    from synodic.models.weights import load_checkpoint
    model = load_checkpoint(tmp_path / "f", "cpu", torch.bfloat16, progress=False)
    seen = 0
    for shard in sorted((tmp_path / "f").glob("model-*.safetensors")):
        for k, v in load_file(str(shard)).items():
            if k.startswith("backbone.layers.0.mixer."):
                assert torch.equal(model.get_parameter("blocks.0.mixer." + k.split("mixer.")[1]), v)
                seen += 1
    assert seen == 8  # in_proj, conv1d weight + bias, dt_bias, A_log, D, norm, out_proj
    assert model.blocks[3].kind == "attention" and model.blocks[3].mixer.rot == 0  # NemotronH: no rotary


def test_hf_load_refuses_a_folder_without_room(tmp_path, monkeypatch, capsys):
    import shutil

    import pytest
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 ** 12, 10 ** 12, 10 ** 6))
    with pytest.raises(SystemExit) as e:
        hf_load.main(["--dir", str(tmp_path / "a" / "b"), "--out", str(tmp_path / "r.json"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "nemotron_h_8b takes 16" in err and "expected a folder with room" in err
    assert not (tmp_path / "a").exists()
