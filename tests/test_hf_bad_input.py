"""Broken Hugging Face folders: one line naming the file and what was expected, through the config
path (model.weights=..., exit 2) and through load_checkpoint, found before anything is allocated."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_folders import write_folder  # noqa: E402

from synodic.config.compose import compose  # noqa: E402
from synodic.config.errors import ConfigError  # noqa: E402
from synodic.models.hf import CheckpointError, hf_problems  # noqa: E402
from synodic.models.weights import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_base")
    write_folder("nemotron_h", d / "nemotron_h")
    write_folder("qwen3_next", d / "qwen3_next")
    return d


def _copy(base, tmp_path, fam="nemotron_h"):
    d = tmp_path / fam
    shutil.copytree(base / fam, d)
    return d


def _edit_config(d, **kv):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kv)
    (d / "config.json").write_text(json.dumps(cfg))


def _index(d):
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]


def _shard_of(d, name):
    return d / _index(d)[name]


def _word_tokenizer(d, n):
    from tokenizers import Tokenizer, models
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0")).save(str(d / "tokenizer.json"))


CASES = {
    "no_config": (lambda d: (d / "config.json").unlink(), "config.json"),
    "unknown_model_type": (lambda d: _edit_config(d, model_type="llama"), "model_type='llama'"),
    "missing_shard": (lambda d: _shard_of(d, "backbone.layers.2.mixer.q_proj.weight").unlink(), "lists shard"),
    "shape_vs_config": (lambda d: _edit_config(d, intermediate_size=100), "from config.json"),
    "truncated_shard": (lambda d: _cut(_shard_of(d, "backbone.layers.0.mixer.in_proj.weight")), "before its last"),
    "tokenizer_vocab": (lambda d: _word_tokenizer(d, 400), "has 400 tokens; expected at most vocab_size=320"),
    # a dense folder whose config turns layer 1 into a moe layer: its MLP tensors are not the MoE layout
    "moe_layer": (lambda d: _edit_config(d, layers_block_type=["mamba", "moe", "attention", "mamba", "mlp", "mamba"]),
                  "is not part of the nemotron_h layout"),
    "hub_pattern_moe_no_experts": (lambda d: (_edit_config(d, hybrid_override_pattern="M-*ME-"),
                                              _drop(d, "layers_block_type"), _drop(d, "n_routed_experts")),
                                   "has no n_routed_experts / num_local_experts"),
    "moe_groups": (lambda d: _edit_config(d, layers_block_type=["mamba", "moe", "attention", "mamba", "mlp", "mamba"],
                                          n_group=3), "n_group=3"),
    "tensor_missing": (lambda d: _edit_config(d, layers_block_type=["mamba", "mlp", "attention", "mamba", "mlp",
                                                                    "mamba", "mlp"]), "backbone.layers.6."),
    # generation would never stop at an EOS outside the vocabulary; a tokenizer folder silently meant raw bytes
    "eos_past_vocab": (lambda d: (d / "generation_config.json").write_text('{"eos_token_id": 1000000000}'),
                       "eos_token_id=1000000000; expected a token id below vocab_size=320"),
    "eos_negative": (lambda d: _edit_config(d, eos_token_id=[-5]), "eos_token_id=-5"),
    "tokenizer_dir": (lambda d: ((d / "tokenizer.json").unlink(missing_ok=True), (d / "tokenizer.json").mkdir()),
                      "tokenizer.json is a directory"),
}


def _drop(d, key):
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop(key)
    (d / "config.json").write_text(json.dumps(cfg))


def _cut(p: Path):
    data = p.read_bytes()
    p.write_bytes(data[:-100])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_folder_is_one_line(base, tmp_path, case):
    edit, needle = CASES[case]
    d = _copy(base, tmp_path)
    edit(d)
    with pytest.raises(ConfigError) as e:
        compose([f"model.weights={d}"])
    lines = e.value.lines
    assert len(lines) == 1 and lines[0].startswith("model.weights") and needle in lines[0], lines
    assert str(d) in lines[0]  # names the folder or the file in it
    with pytest.raises(ConfigError) as e2:  # the Python API says the same (CheckpointError for HF folders)
        load_checkpoint(d, progress=False)
    assert needle in str(e2.value)


def test_rope_scaling_and_unknown_tensor(base, tmp_path):
    d = _copy(base, tmp_path, "qwen3_next")
    _edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    (line,) = hf_problems(d)
    assert "rope_type='yarn'" in line and "config.json" in line
    d2 = tmp_path / "extra"
    shutil.copytree(base / "qwen3_next", d2)
    from safetensors.torch import load_file, save_file
    shard = d2 / _index(d2)["model.norm.weight"]
    t = load_file(str(shard))
    t["model.layers.0.mlp.experts.0.up_proj.weight"] = t["model.norm.weight"].clone()
    save_file(t, str(shard))
    (line,) = hf_problems(d2)
    assert "'model.layers.0.mlp.experts.0.up_proj.weight' is not part of the qwen3_next layout" in line
    with pytest.raises(CheckpointError):
        load_checkpoint(d2, progress=False)


def test_cli_exits_2(base, tmp_path):
    d = _copy(base, tmp_path)
    _edit_config(d, model_type="llama")
    r = subprocess.run([sys.executable, "run.py", f"model.weights={d}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "model_type='llama'" in r.stderr, r.stderr[-2000:]


def test_the_readme_folder_command_runs_from_the_checkout(tmp_path):
    """README: `python -m tests.hf_folders nemotron_h DIR` from the repository root, where the root's `kernels/`
    must not shadow the `kernels` package transformers imports."""
    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "tests.hf_folders", "nemotron_h", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert hf_problems(out) == []
