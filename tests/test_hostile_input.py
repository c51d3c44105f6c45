"""Hostile input over every group, every file-taking key and each class of bad value: exit code 2, no
traceback, one `error: ` line per problem naming the key. Most cases run in-process through
`synodic.config.hydra_errors.check` (what run.py calls before Hydra's main); a few run `python run.py`."""
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from synodic.config.components import load_all
from synodic.config.hydra_errors import check, options
from synodic.config.registry import GROUPS, REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "synodic" / "assets" / "models"
load_all()


def _numeric(ann):
    args = set(typing.get_args(ann)) or {ann}
    if bool in args:
        return None
    return "int" if int in args else "float" if float in args else None


def _literal(ann):
    if typing.get_origin(ann) is typing.Literal:
        return True
    return any(typing.get_origin(a) is typing.Literal for a in typing.get_args(ann))


def field_cases():
    """(argv, key that the error must name) for every option of every group."""
    out, seen = [], set()
    for g in GROUPS:
        out.append(([f"{g}=no_such_option"], g))
        for opt in options(g):
            cls = REGISTRIES[g].classes[opt]
            sel = [] if g == "pipeline" and opt == "decode" else [f"{g}={opt}"]
            out.append(([*sel, f"{g}.no_such_key=1"], f"{g}.no_such_key"))
            out.append(([*sel, f"+{g}.no_such_key=1"], f"{g}.no_such_key"))
            # one bad value per field, cycling through the classes of bad value (compose costs ~0.1 s a case)
            for i, (name, f) in enumerate(cls.model_fields.items()):
                if name == "kind" or (cls, name) in seen:
                    continue
                seen.add((cls, name))
                num = _numeric(f.annotation)
                if num == "int":
                    out.append(([*sel, f"{g}.{name}={('true', 'not_a_number', 'false')[i % 3]}"], f"{g}.{name}"))
                elif num == "float":
                    out.append(([*sel, f"{g}.{name}={('nan', 'inf', '-inf', 'true')[i % 4]}"], f"{g}.{name}"))
                elif _literal(f.annotation):
                    out.append(([*sel, f"{g}.{name}=__not_an_option__"], f"{g}.{name}"))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "empty.txt").write_bytes(b"")
    (d / "blank.txt").write_bytes(b"\n  \n")
    (d / "binary.txt").write_bytes(bytes(range(256)))
    (d / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (d / "utf16.txt").write_bytes("hello\n".encode("utf-16"))
    src = MODELS / "tiny_mamba2"
    for name, edit in {"no_config": lambda p: (p / "config.json").unlink(),
                       "bad_config": lambda p: (p / "config.json").write_text("{broken"),
                       "wrong_config": lambda p: (p / "config.json").write_text('{"hidden_size": "big"}'),
                       "no_weights": lambda p: (p / "model.safetensors").unlink(),
                       "trunc_head": lambda p: _cut(p / "model.safetensors", 100),
                       "trunc_tail": lambda p: _cut(p / "model.safetensors", -1000),
                       "bad_tokenizer": lambda p: (p / "tokenizer.json").write_text("garbage"),
                       "json_tokenizer": lambda p: (p / "tokenizer.json").write_text('{"a": 1}')}.items():
        p = d / name
        p.mkdir()
        for f in src.iterdir():
            (p / f.name).write_bytes(f.read_bytes())
        edit(p)
    (d / "a_file").write_text("x")
    return d


def _cut(path: Path, n: int):
    data = path.read_bytes()
    path.write_bytes(data[:n] if n > 0 else data[:n])


def file_cases(d: Path):
    out = []
    for f in ("empty.txt", "blank.txt", "binary.txt", "latin1.txt", "utf16.txt", "missing.txt"):
        out.append(([f"workload.path={d / f}"], "workload.path"))
        out.append((["pipeline=eval", f"pipeline.text={d / f}"], "pipeline.text"))
        out.append((["pipeline=train", f"pipeline.data=[{d / f}]"], "pipeline.data"))
        out.append((["pipeline=train", f"pipeline.tokenizer={d / f}"], "pipeline.tokenizer"))
    for w in ("no_config", "bad_config", "wrong_config", "no_weights", "trunc_head", "trunc_tail",
              "bad_tokenizer", "json_tokenizer", "missing_dir", "a_file"):
        out.append(([f"model.weights={d / w}"], "model.weights"))
    for bad in ("/dev/null", "/proc/self/status", "''", f"{d / 'a_file'}", f"{d / 'no_config'}"):
        # a device, one document (nothing to hold out), an empty path, a folder without text documents
        out.append((["pipeline=train", f"pipeline.data=[{bad}]"], "pipeline.data"))
    out.append((["pipeline=train", "pipeline.export_to=''"], "pipeline.export_to"))
    out.append((["pipeline=quantize", "quant=nvfp4", "pipeline.store=''"], "pipeline.store"))
    out.append((["pipeline=train", f"pipeline.export_to={d / 'a_file'}"], "pipeline.export_to"))
    out.append((["pipeline=train", f"pipeline.export_to={d / 'a_file' / 'sub'}"], "pipeline.export_to"))
    return out


OTHER = [
    (["pipeline=eval", "pipeline.quant_grid=[foo:rtn]"], "pipeline.quant_grid"),
    (["pipeline=eval", "pipeline.quant_grid=[mxfp4:magic]"], "pipeline.quant_grid"),
    (["pipeline=eval", "pipeline.quant_grid=[:rtn]"], "pipeline.quant_grid"),
    (["runtime.max_slots=${nope}"], "runtime.max_slots"),
    (["workload.max_tokens=${runtime.nothere}"], "workload.max_tokens"),
    (["runtime.max_slots=[1,"], "runtime.max_slots=[1,"),
    (["=3"], "=3"),
    (["model=="], "model"),
    (["+runtime.max_slots=4"], "runtime.max_slots"),
    (["runtime.max_slots=0"], "runtime.max_slots"),
    (["runtime.max_slots=-4"], "runtime.max_slots"),
    (["pipeline=bench", "pipeline.batch_sizes=[0]"], "pipeline.batch_sizes"),
    (["pipeline=bench", "pipeline.batch_sizes=[-1,2]"], "pipeline.batch_sizes"),
    (["pipeline=bench", "runtime.max_slots=2", "pipeline.batch_sizes=[4]"], "pipeline.batch_sizes"),
    (["runtime.device=cpu", "runtime.cuda_graphs=true"], "runtime.cuda_graphs"),
    (["pipeline=train", "pipeline.betas=[nan,0.9]"], "pipeline.betas"),
    (["pipeline=train", "pipeline.lr=-1"], "pipeline.lr"),
    (["pipeline=eval", "pipeline.reference={pipeline: {kind: none}}"], "pipeline.reference"),
    (["workload=chat", "workload.prompt_len=100000", "kv.num_blocks=2"], "workload.prompt_len"),
    (["pipeline=train", "pipeline.betas=[2,3]"], "pipeline.betas"),
    (["pipeline=train", "pipeline.betas=[0.9,1.0]"], "pipeline.betas"),
    (["pipeline=eval", "pipeline.quant_mode=w9a9"], "pipeline.quant_mode"),
    (["pipeline=eval", "pipeline.quant_mode=w8a8", "pipeline.quant_grid=[mxfp4:rtn]"], "pipeline.quant_grid"),
    (["hydra/launcher=nope"], "hydra/launcher='nope'"),
    (["hydra.nope=1"], "hydra.nope"),
    (["hydra.job.chdir=notabool"], "hydra.job.chdir"),
    (["--config-name", "nope"], "--config-name"),
]


def _assert_one_line_errors(code, lines, key):
    text = "\n".join(lines)
    assert code == 2, text
    assert "Traceback" not in text and lines, text
    assert all(line.startswith("error: ") for line in lines), text
    assert any(key in line for line in lines), (key, text)
    assert not any(line.startswith("error: {") or "<root>" in line for line in lines), text


CASES = field_cases() + OTHER


@pytest.mark.parametrize("argv,key", CASES, ids=[" ".join(a)[:80] for a, _ in CASES])
def test_config_case(argv, key):
    _assert_one_line_errors(*check(argv), key)


def test_file_cases(files):
    cases = file_cases(files)
    for argv, key in cases:
        code, lines = check(argv)
        _assert_one_line_errors(code, lines, key)
    assert len(cases) >= 30


def test_case_count():
    assert len(CASES) + len(file_cases(Path("/x"))) >= 150


def test_help_lists_groups_options_and_fields():
    code, lines = check(["--help"])
    text = "\n".join(lines)
    assert code == 0
    for g in GROUPS:
        assert f"\n{g}: " in text
        for opt in options(g):
            assert opt in text
    assert "runtime.max_slots" in text and "state slots" in text


def test_good_command_line_passes():
    assert check(["runtime.device=cpu", "workload.max_tokens=2"]) == (None, [])
    assert check(["hydra/launcher=basic", "hydra.job.chdir=false", "--config-name", "config"]) == (None, [])


def test_a_two_document_corpus_passes(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "b.md").write_text("two\n")
    assert check(["pipeline=train", f"pipeline.data=[{tmp_path}]"]) == (None, [])
    code, lines = check(["pipeline=train", f"pipeline.data=[{tmp_path / 'a.txt'}]"])
    assert code == 2 and "1 document" in lines[0], lines


SUBPROCESS = [
    ["model=nope"], ["ssm.nope=1"], ["x=[1,"], ["runtime.max_slots=${nope}"], ["runtime.max_slots=true"],
    ["pipeline=train", "pipeline.lr=inf"], ["workload.path=/nonexistent/prompts.txt"],
    ["pipeline=bench", "runtime.max_slots=2", "pipeline.batch_sizes=[4]"], ["+kv.nope=1"],
    ["pipeline=eval", "pipeline.quant_grid=[foo:rtn]"],
    ["pipeline=bench", "pipeline.variants=['spec=bogus']"],
    ["pipeline=bench", "pipeline.variants=['', 'spec=dflash2 spec.max_batch=0', 'spec.nope=1']"],
]


@pytest.mark.parametrize("argv", SUBPROCESS, ids=[" ".join(a) for a in SUBPROCESS])
def test_run_py(argv, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), *argv, f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and all(x.startswith("error: ") for x in lines), p.stderr
    assert not (tmp_path / "results.json").exists()


def test_bench_variant_errors_name_the_variant(tmp_path):
    """A bad variant is a Hydra option error or a schema error of a config composed inside the pipeline: each is
    one line naming the variant, all reported together."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), "pipeline=bench",
                        "pipeline.variants=['spec=bogus', '', 'spec=dflash2 spec.max_batch=0']",
                        f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 2, p.stderr
    assert lines[0].startswith("error: pipeline.variants[0]='spec=bogus': spec='bogus': unknown option"), lines
    assert lines[1].startswith("error: pipeline.variants[2]='spec=dflash2 spec.max_batch=0': spec.max_batch=0"), lines


@pytest.mark.parametrize("mod", ["synodic.train", "synodic.data"])
def test_module_entry_points(mod, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    h = subprocess.run([sys.executable, "-m", mod, "--help"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=120)
    assert h.returncode == 0 and "python -m" in h.stdout
    bad = subprocess.run([sys.executable, "-m", mod, "junk"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: 'junk'") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("argv", [["ssm.kernel=triton", "runtime.device=cpu"],
                                  ["ssm=replay", "ssm.kernel=triton", "runtime.device=cpu"]])
def test_triton_kernel_forced_on_cpu(argv, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)   # conftest sets it for the CPU kernel tests
    _assert_one_line_errors(*check(argv), "ssm.kernel")


def test_hydra_flags_that_take_a_value_are_not_overrides():
    """`--cfg job` (the README's command) and `--package` take a value: it is not an override to parse."""
    from synodic.config.hydra_errors import check
    assert check(["--cfg", "job"]) == (None, [])
    assert check(["-c", "job", "ssm=replay"]) == (None, [])
    code, lines = check(["--cfg", "job", "ssm=nope"])
    assert code == 2 and len(lines) == 1 and "ssm='nope'" in lines[0]


def test_run_dir_that_cannot_be_created_is_one_line(tmp_path):
    """Hydra creates hydra.run.dir before the job (a traceback when it cannot): the guard checks it first."""
    (tmp_path / "file").write_text("x")
    code, lines = check([f"hydra.run.dir={tmp_path / 'file' / 'run'}"])
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: hydra.run.dir="), lines
    assert check([f"hydra.run.dir={tmp_path / 'fresh' / 'run'}"]) == (None, [])


@pytest.mark.parametrize("argv,line", [
    (["kv=adaptive", "kv.hot_buffer=1"],
     "error: kv.hot_buffer=1 with kv.top_k=2048: expected kv.hot_buffer >= kv.top_k"),
    (["spec=ngram", "spec.min_ngram=5", "spec.max_ngram=2"],
     "error: spec.min_ngram=5 with spec.max_ngram=2: expected spec.min_ngram <= spec.max_ngram")])
def test_a_rule_over_several_fields_names_them_not_the_group(argv, line):
    """A component's own cross-field rule is one line naming its keys (the dumped group dict was printed before)."""
    assert check(argv) == (2, [line])


@pytest.mark.parametrize("argv,line", [
    (["pipeline=sweep", "pipeline.grid=5"], "error: pipeline.grid=5: expected a mapping {key: value} or a list of "
     "strings or a list of lists of strings"),
    (["pipeline=sweep", "pipeline.grid=[a,[1,{x: 1}]]"], "error: pipeline.grid=['a', [1, {'x': 1}]]: expected a "
     "mapping {key: value} or a list of strings or a list of lists of strings")])
def test_a_plain_union_is_one_line_in_words(argv, line):
    """A value no member of a plain union accepts: one line naming the key and the members in words, not pydantic's
    line per member under its internal type name (pipeline.grid.dict[str,list[any]]=5)."""
    assert check(argv) == (2, [line])


def test_an_empty_sweep_axis_is_refused(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), "pipeline=sweep",
                        "pipeline.grid={ssm: [], kv: [resident]}", f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: pipeline.grid.ssm=[]: an axis with no values makes no trials; expected at least one value"], p.stderr


@pytest.mark.parametrize("key", ["store", "export_hf"])
def test_quantize_output_dirs_are_checked_first(key, tmp_path):
    (tmp_path / "file").write_text("x")
    code, lines = check(["pipeline=quantize", "quant=nvfp4", f"pipeline.{key}={tmp_path / 'file' / 'q'}"])
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: pipeline.{key}="), lines


def test_eager_verify_window_states_are_in_the_budget():
    """ssm=eager keeps 1 + γ states per slot: a γ that cannot fit is refused naming spec.num_speculative_tokens
    (it was a DefaultCPUAllocator traceback when the state backend was built)."""
    import torch

    from synodic.config.budget import check_fits
    from synodic.config.compose import compose
    from synodic.config.errors import ConfigError
    cfg = compose(["spec=ngram", "spec.num_speculative_tokens=100000", "runtime.device=cpu"])
    with pytest.raises(ConfigError) as e:
        check_fits(cfg, torch.device("cpu"))
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith("spec.num_speculative_tokens=100000: "), e.value
