"""Hostile checkpoints, Hugging Face folders, drafter directories and paths: one line naming the key, the value and
what was expected, exit code 2, found while the config is validated (before any model is built).
The broken files are damaged copies of the shipped tiny checkpoints and drafters, and tiny transformers-written
HF folders. Most cases run in-process through `synodic.config.hydra_errors.check` (what run.py calls first)."""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from synodic.config.errors import ConfigError
from synodic.config.hydra_errors import check
from synodic.models.hf import CheckpointError, hf_problems
from synodic.models.weights import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "synodic" / "assets" / "models"
DRAFTERS = ROOT / "synodic" / "assets" / "drafters"


def _one_line(code, lines, key):
    text = "\n".join(lines)
    assert code == 2 and len(lines) == 1, text
    assert lines[0].startswith(f"error: {key}") and "expected" in lines[0] and "Traceback" not in text, text
    assert len(lines[0]) < 500, text


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _raw_safetensors(path: Path, header) -> None:
    """A file with this JSON header and 16 bytes of data (a well-formed length prefix around a bad header)."""
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(16))


def _edit_state(d: Path, edit) -> None:
    st = load_file(str(d / "model.safetensors"))
    edit(st)
    save_file(st, str(d / "model.safetensors"))


# ---------------------------------------------------------------- 1. native tensors vs config.json

def _foreign(d):  # tiny_gdn's config.json over tiny_mamba2's weights
    shutil.copy(MODELS / "tiny_gdn" / "config.json", d / "config.json")


NATIVE = {
    "foreign_weights": (_foreign, "is not part of the qwen3_next model"),
    "missing_tensor": (lambda d: _edit_state(d, lambda s: s.pop("blocks.0.mixer.conv1d.weight")),
                       "no tensor 'blocks.0.mixer.conv1d.weight'"),
    "wrong_shape": (lambda d: _edit_state(d, lambda s: s.update({"norm_f.weight": s["norm_f.weight"][:7].clone()})),
                    "has shape [7]"),
    "no_tensors": (lambda d: save_file({}, str(d / "model.safetensors")), "no tensor 'embed_tokens.weight'"),
}


@pytest.mark.parametrize("case", sorted(NATIVE))
def test_native_tensors_must_match_config(case, tmp_path):
    edit, needle = NATIVE[case]
    d = _copy(MODELS / "tiny_mamba2", tmp_path / case)
    edit(d)
    code, lines = check([f"model.weights={d}"])
    _one_line(code, lines, "model.weights")
    assert needle in lines[0], lines
    with pytest.raises(CheckpointError, match="expected"):  # the Python API refuses it before load_state_dict
        load_checkpoint(d)


# ---------------------------------------------------------------- 2. tokenizer vs the vocabulary

def test_tokenizer_larger_than_vocab(tmp_path):
    d = _copy(MODELS / "tiny_mamba2", tmp_path / "small_vocab")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 100
    (d / "config.json").write_text(json.dumps(cfg))
    _edit_state(d, lambda s: s.update({k: s[k][:100].clone() for k in ("embed_tokens.weight", "lm_head.weight")
                                       if k in s}))
    code, lines = check([f"model.weights={d}"])
    _one_line(code, lines, "model.weights")
    assert "tokens; expected at most vocab_size=100" in lines[0], lines
    (d / "tokenizer.json").unlink()  # raw UTF-8 bytes need 256 ids
    _one_line(*check([f"model.weights={d}"]), "model.weights")
    code, lines = check(["+model.overrides.vocab_size=100"])
    _one_line(code, lines, "model.overrides.vocab_size=100")
    assert check(["+model.overrides.vocab_size=300"]) == (None, [])


# ---------------------------------------------------------------- 3. malformed safetensors headers

HEADERS = {"list": [], "entry_int": {"a": 1}, "no_offsets": {"a": {"dtype": "F32", "shape": [1]}},
           "offsets_str": {"a": {"dtype": "F32", "shape": [1], "data_offsets": "xx"}},
           "shape_str": {"a": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_malformed_safetensors_header(case, tmp_path):
    d = _copy(MODELS / "tiny_mamba2", tmp_path / case)
    _raw_safetensors(d / "model.safetensors", HEADERS[case])
    code, lines = check([f"model.weights={d}"])
    _one_line(code, lines, "model.weights")
    assert "not a safetensors file" in lines[0], lines


# ---------------------------------------------------------------- 4. malformed Hugging Face config.json

@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_folders import write_folder
    d = tmp_path_factory.mktemp("hf")
    write_folder("nemotron_h", d / "nemotron_h")
    write_folder("qwen3_next", d / "qwen3_next")
    return d


def _set(**kv):
    def edit(d):
        cfg = json.loads((d / "config.json").read_text())
        for k, v in kv.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _first_shard(d):
    wm = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    _raw_safetensors(d / sorted(set(wm.values()))[0], [])


MOE = ["mamba", "moe", "attention", "mamba", "mlp", "mamba"]
HF = {
    "heads_zero": ("nemotron_h", _set(num_attention_heads=0, head_dim=None), "num_attention_heads=0"),
    "heads_str": ("nemotron_h", _set(num_attention_heads="abc", head_dim=None), "num_attention_heads='abc'"),
    "pattern_int": ("nemotron_h", _set(hybrid_override_pattern=5, layers_block_type=None), "hybrid_override_pattern=5"),
    "block_types_nested": ("nemotron_h", _set(layers_block_type=[["mamba"]]), "layers_block_type=[['mamba']]"),
    "n_group_str": ("nemotron_h", _set(layers_block_type=MOE, n_group="abc"), "n_group='abc'"),
    "layer_types_int": ("qwen3_next", _set(layer_types=7), "layer_types=7"),
    "interval_zero": ("qwen3_next", _set(layer_types=None, full_attention_interval=0), "full_attention_interval=0"),
    "rope_list": ("qwen3_next", _set(rope_parameters=[1]), "rope_parameters=[1]"),
    "shard_header_list": ("nemotron_h", _first_shard, "not a safetensors file"),
}


@pytest.mark.parametrize("case", sorted(HF))
def test_malformed_hf_folder(hf, case, tmp_path):
    fam, edit, needle = HF[case]
    d = _copy(hf / fam, tmp_path / fam)
    edit(d)
    (line,) = hf_problems(d)
    assert needle in line and "expected" in line, line
    if case == "heads_str":  # the config path names the key
        code, lines = check([f"model.weights={d}"])
        _one_line(code, lines, "model.weights")


# ---------------------------------------------------------------- 5. drafter directories

def _drafter(tmp_path, name, edit):
    d = _copy(DRAFTERS / "tiny_mamba2" / "dflash", tmp_path / name)
    edit(d)
    return d


def _layers(v):
    def edit(d):
        cfg = json.loads((d / "config.json").read_text())
        cfg["target_layers"] = v
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


DRAFTER = {
    "mixed_weights": (lambda d: shutil.copy(DRAFTERS / "tiny_mamba2" / "dflash2" / "model.safetensors", d),
                      "not part of the dflash drafter"),
    "empty_weights": (lambda d: save_file({}, str(d / "model.safetensors")),
                      "model.safetensors: no tensor 'mask_embedding'"),
    "bad_header": (lambda d: _raw_safetensors(d / "model.safetensors", {"a": 1}), "not a safetensors file"),
    "no_layers": (_layers([]), "target_layers=[]"),
    "negative_layer": (_layers([-1, 2]), "target_layers=[-1, 2]"),
    "garbage_config": (lambda d: (d / "config.json").write_text("{\n garbage"), "is not a drafter config"),
}


@pytest.mark.parametrize("case", sorted(DRAFTER))
def test_broken_drafter_dir(case, tmp_path):
    from synodic.spec.models import check_drafter_dir
    edit, needle = DRAFTER[case]
    d = _drafter(tmp_path, case, edit)
    code, lines = check(["spec=dflash", f"spec.drafter={d}"])  # validated with the config, before any model
    _one_line(code, lines, "spec.drafter=")
    assert needle in lines[0], lines
    with pytest.raises(ConfigError) as e:  # the same check guards load_draft_model and shipped (auto) drafters
        check_drafter_dir(d)
    (line,) = e.value.lines
    assert line.startswith("spec.drafter=") and needle in line, line


def test_drafter_for_another_target_says_what_was_expected():
    from synodic.models.presets import PRESETS
    from synodic.spec.models import load_draft_model
    with pytest.raises(ConfigError) as e:
        load_draft_model(DRAFTERS / "tiny_mamba2" / "dflash", PRESETS["tiny_gdn"])
    (line,) = e.value.lines
    assert "this model has 8 blocks; expected target_layers below 8" in line, line


def test_drafter_for_another_target_fails_before_the_target_loads(monkeypatch):
    """build_graph checks the drafter against the target's config before building the target (minutes for a
    large checkpoint), not when the drafter loads after it."""
    import synodic.graph as graph
    from synodic.config.compose import compose

    def never(*a, **k):
        raise AssertionError("the target was built before the drafter's fit was checked")
    monkeypatch.setattr(graph, "load_model", never)
    cfg = compose(["model=tiny_gdn", "spec=dflash", f"spec.drafter={DRAFTERS / 'tiny_mamba2' / 'dflash'}",
                   "runtime.device=cpu"])
    with pytest.raises(ConfigError) as e:
        graph.build_graph(cfg, max_seq_len=64)
    (line,) = e.value.lines
    assert "trained for model=tiny_mamba2, this run's is model=tiny_gdn" in line, line  # (its kind, checked first)


# ---------------------------------------------------------------- 6, 7. long paths, directories for files

LONG = "/tmp/" + "x" * 5000


@pytest.mark.parametrize("argv,key", [
    ([f"workload.path={LONG}"], "workload.path"),
    (["pipeline=eval", f"pipeline.text={LONG}"], "pipeline.text"),
    ([f"model.weights={LONG}"], "model.weights"),
    (["pipeline=train", f"pipeline.data=[{LONG}]"], "pipeline.data"),
    (["pipeline=train", f"pipeline.export_to={LONG}"], "pipeline.export_to"),
    (["spec=dflash", f"spec.drafter={LONG}"], "spec.drafter"),
])
def test_very_long_path_is_an_invalid_path(argv, key):
    code, lines = check(argv)
    _one_line(code, lines, key)
    assert "not a valid path (File name too long)" in lines[0], lines


@pytest.mark.parametrize("argv,key", [(["workload.path={d}"], "workload.path"),
                                      (["pipeline=eval", "pipeline.text={d}"], "pipeline.text"),
                                      (["pipeline=train", "pipeline.tokenizer={d}"], "pipeline.tokenizer")])
def test_a_directory_where_a_file_is_expected(argv, key, tmp_path):
    code, lines = check([a.format(d=tmp_path) for a in argv])
    _one_line(code, lines, key)
    assert "is a directory" in lines[0], lines


# ---------------------------------------------------------------- through run.py

def _run(argv, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *argv, f"hydra.run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180)


@pytest.mark.parametrize("case", ["checkpoint", "vocab_override", "drafter"])
def test_run_py_exits_2_with_one_line(case, tmp_path):
    if case == "checkpoint":
        d = _copy(MODELS / "tiny_mamba2", tmp_path / "ck")
        _foreign(d)
        argv, key = [f"model.weights={d}", "workload.max_tokens=4"], "model.weights"
    elif case == "vocab_override":
        argv, key = ["+model.overrides.vocab_size=100", "workload.max_tokens=4"], "model.overrides.vocab_size"
    else:
        d = _drafter(tmp_path, "dr", DRAFTER["mixed_weights"][0])
        argv, key = ["spec=dflash", f"spec.drafter={d}", "workload.max_tokens=4"], "spec.drafter"
    p = _run(argv, tmp_path)
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith(f"error: {key}") and "expected" in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "run" / "results.json").exists()
