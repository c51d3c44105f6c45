"""Hostile config values: each is refused with exit code 2 and one `error: ` line naming the
key, the value and what was expected; a bench that fails part-way keeps the points it timed. Most cases run
in-process through the validation functions (`hydra_errors.check` is what run.py calls before Hydra's main);
a few run `python run.py`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.config.hydra_errors import check

ROOT = Path(__file__).resolve().parents[1]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the case is a machine without CUDA")


def _one_line(code, lines, *needles):
    text = "\n".join(lines)
    assert code == 2 and len(lines) == 1, text
    assert lines[0].startswith("error: ") and "Traceback" not in text, text
    assert "expected" in lines[0], text
    for n in needles:
        assert n in lines[0], (n, text)


def _config_error(fn, *needles) -> list[str]:
    with pytest.raises(ConfigError) as e:
        fn()
    lines = e.value.lines
    assert lines and all("\n" not in x and "expected" in x for x in lines), lines
    for n in needles:
        assert any(n in x for x in lines), (n, lines)
    return lines


def _run_py(argv, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120, **kw)


# 6: a Triton quant backend forced on a machine that cannot run it; the kernel's own message names quant.backend
@no_cuda
def test_quant_backend_triton_without_cuda(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest sets it for the CPU kernel tests
    _one_line(*check(["quant=mxfp4", "quant.backend=triton"]), "quant.backend=triton", "auto or torch")
    assert check(["quant=mxfp4", "quant.backend=torch"]) == (None, [])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # emulated: the device is fine, but the format must be a kernel's
    _one_line(*check(["quant=int4_g64", "quant.backend=triton"]), "quant=int4_g64", "quant=mxfp4 or nvfp4")


def test_quant_kernel_message_offers_the_config_choices(monkeypatch):
    from synodic.kernels.quant_linear import quant_linear

    from synodic.quant.qtensor import quantize
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = quantize(torch.randn(32, 64), "mxfp4")
    with pytest.raises(ValueError, match="expected quant.backend=auto or torch"):
        quant_linear(torch.randn(1, 64), q, None, None, backend="triton")


def test_bench_keeps_the_points_timed_before_a_failing_variant(tmp_path):
    """The second variant cannot hold its pages (known only once its graph is built): the first variant's row
    is written (bench.md, bench.csv, results.json marked incomplete), then one error line and exit 2."""
    run = tmp_path / "run"
    p = _run_py(["pipeline=bench", "pipeline.batch_sizes=[1]", "pipeline.variants=['','kv.num_blocks=1']",
                 "pipeline.steps=2", "pipeline.repeats=1", "pipeline.warmup=0", "pipeline.stagger=0",
                 "runtime.device=cpu", f"hydra.run.dir={run}"], tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: pipeline.variants[1]='kv.num_blocks=1': kv.num_blocks=1"), lines
    assert "base" in (run / "bench.md").read_text() and "incomplete" in (run / "bench.md").read_text()
    assert (run / "bench.csv").read_text().count("\n") == 2  # header + the base row
    doc = json.loads((run / "results.json").read_text())
    assert [r["variant"] for r in doc["bench"]] == ["base"] and doc["incomplete"]["at"].startswith("pipeline.var")


def test_a_failed_bench_rerun_keeps_the_earlier_complete_run(tmp_path):
    """A rerun in the directory of a complete bench that fails part-way writes what it timed under incomplete/
    and leaves the earlier results.json, bench.csv and .hydra/ as they were."""
    run = tmp_path / "run"
    common = ["pipeline=bench", "pipeline.batch_sizes=[1]", "pipeline.steps=2", "pipeline.repeats=1",
              "pipeline.warmup=0", "pipeline.stagger=0", "runtime.device=cpu", f"hydra.run.dir={run}"]
    assert _run_py([*common, "pipeline.variants=['','ssm=replay']"], tmp_path).returncode == 0
    before = {n: (run / n).read_bytes() for n in ("results.json", "bench.csv", "bench.md", ".hydra/overrides.yaml")}
    p = _run_py([*common, "pipeline.variants=['','kv.num_blocks=1']"], tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert {n: (run / n).read_bytes() for n in before} == before
    doc = json.loads((run / "incomplete" / "results.json").read_text())
    assert [r["variant"] for r in doc["bench"]] == ["base"] and "incomplete" in doc
    assert (run / "incomplete" / "bench.csv").read_text().count("\n") == 2


# 7: pipeline.device=cuda for the training pipelines on a CPU machine: refused before the memory estimate
@no_cuda
@pytest.mark.parametrize("argv", [["pipeline=train"], ["pipeline=train_drafter", "spec=dflash"]])
def test_training_device_cuda_without_cuda(argv):
    from synodic.config.budget import available_bytes, check_fits
    cfg = compose([*argv, "pipeline.device=cuda"])
    _config_error(lambda: check_fits(cfg, torch.device("cpu")), "pipeline.device='cuda'")
    _config_error(lambda: available_bytes(torch.device("cuda")), "device='cuda'")


# 8: seeds torch cannot take
SEEDS = [["runtime.seed={}"], ["model.seed={}"], ["workload.seed={}"],
         ["spec=dflash", "spec.drafter=random", "spec.seed={}"], ["pipeline=train", "pipeline.seed={}"],
         ["pipeline=bench", "pipeline.acceptance_seed={}"]]


@pytest.mark.parametrize("argv", SEEDS, ids=[a[-1] for a in SEEDS])
@pytest.mark.parametrize("seed", ["99999999999999999999999", "18446744073709551616", "-1"])
def test_seed_out_of_range(argv, seed):
    over = [a.format(seed) for a in argv]
    _one_line(*check(over), over[-1].partition("=")[0], "[0, 2**63)")


def test_seed_in_a_bench_variant_is_refused_before_timing():
    from synodic.pipelines.bench import _compose_variants
    cfg = compose(["pipeline=bench", "pipeline.variants=['runtime.seed=99999999999999999999999']"])
    _config_error(lambda: _compose_variants(cfg, []), "pipeline.variants[0]=", "runtime.seed=")


# 9: train's tokenizer must parse as a tokenizers file; too small a corpus names data and seq_len
def test_train_tokenizer_that_is_plain_text(tmp_path):
    (tmp_path / "tok.txt").write_text("just some text\n")
    _one_line(*check(["pipeline=train", f"pipeline.tokenizer={tmp_path / 'tok.txt'}"]), "pipeline.tokenizer=",
              "tokenizer.json")


def test_train_corpus_too_small_for_seq_len(tmp_path, monkeypatch):
    from synodic.models.presets import PRESETS
    from synodic.train.config import TrainPipeline
    from synodic.train.trainer import train
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"document {i}\n")
    s = TrainPipeline(data=[str(docs)], seq_len=4096, batch_size=2, device="cpu", max_steps=1)
    _config_error(lambda: train(s, tmp_path / "run", PRESETS["tiny_mamba2"], quiet=True), "pipeline.seq_len=4096",
                  "pipeline.data=", "pipeline.batch_size=2")


# 10: multirun sweep syntax through the one-line guard
@pytest.mark.parametrize("argv,needle", [
    (["-m", "ssm=eager,"], "'ssm=eager,'"),
    (["-m", "workload.max_tokens=choice()"], "choice()"),
    (["-m", "runtime.max_slots=glob(*)"], "glob(*)"),
    (["-m", "ssm=glob(zz*)"], "glob(zz*)"),
    (["-m", "workload.max_tokens=interval(1,4)"], "interval(1,4)"),
    (["-m", "ssm=eager,replay", "hydra.sweeper.params={a: 1}"], "hydra.sweeper.params"),
    (["-m", "hydra/launcher=nope", "ssm=eager,replay"], "hydra/launcher='nope': unknown option"),
])
def test_multirun_sweep_syntax(argv, needle):
    _one_line(*check(argv), needle)


def test_multirun_range_over_a_group_names_the_option():
    from synodic.config.multirun import check_multirun
    lines = _config_error(lambda: check_multirun(["-m", "ssm=range(0,2)"]))
    assert all("ssm='0'" in x or "ssm='1'" in x for x in lines) and "unknown option" in lines[0], lines
    # the jobs' own problems are theirs to report, never blamed on a Hydra setting beside them
    assert check(["-m", "ssm=range(0,2)", "hydra.sweep.dir=/tmp/sweep"]) == (None, [])


def test_multirun_glob_over_a_group_expands_its_options():
    from synodic.config.multirun import jobs
    assert jobs(["ssm=glob(*)"]) == [["ssm=eager"], ["ssm=replay"]]
    assert check(["-m", "ssm=glob(*)"]) == (None, [])


# 11: ablation study files
STUDIES = {
    "broken": b"base: [\n",
    "wrong": b"base: 5\narms: 3\n",
    "list": b"- a\n- b\n",
    "badutf": b"base: []\narms:\n  - {name: r, overrides: [ssm=replay]}\n# \xff\xfe\n",
    "baseint": b"base: [5, null]\narms:\n  - {name: r, overrides: [ssm=replay]}\n",
    "strover": b"base: []\narms:\n  - {name: r, overrides: ssm=replay}\n",
    "armint": b"base: []\narms:\n  - 7\n",
    "quality": b"arms:\n  - {name: r, overrides: [ssm=replay]}\nquality: maybe\n",
}


@pytest.mark.parametrize("name", list(STUDIES))
def test_ablation_study_file(name, tmp_path):
    from synodic.pipelines.ablate import load_study
    f = tmp_path / f"{name}.yaml"
    f.write_bytes(STUDIES[name])
    lines = _config_error(lambda: load_study(str(f)), f"pipeline.study='{f}'")
    assert len(lines) <= 2, lines


def test_hydra_error_formatter_takes_non_string_overrides():
    from hydra.errors import HydraException

    from synodic.config.hydra_errors import format_hydra_error
    assert len(format_hydra_error(HydraException("boom"), [5, None])) == 1


# 12: names past the file system's limit
@pytest.mark.parametrize("argv,needle", [(["ssm." + "x" * 5000 + "=1"], "unknown key (5004 characters)"),
                                         (["spec=" + "x" * 5000], "unknown option (5000 characters)")])
def test_very_long_key_or_option(argv, needle):
    code, lines = check(argv)
    _one_line(code, lines, needle)
    assert len(lines[0]) < 300


# 13: Hydra's own config
@pytest.mark.parametrize("argv,needle", [
    (["hydra.run.dir="], "hydra.run.dir='': an empty path"),
    (["hydra.job_logging.root.level=BOGUS"], "hydra.job_logging.root.level='BOGUS'"),
    (["hydra.job_logging.handlers.file.filename=/proc/nope/x.log"], "hydra.job_logging.handlers.file.filename="),
    (["--config-path", "/tmp"], "--config-path='/tmp'"),
])
def test_hydra_own_config(argv, needle):
    _one_line(*check(argv), needle)


def test_hydra_output_subdir_on_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    _one_line(*check([f"hydra.run.dir={tmp_path / 'run'}", f"hydra.output_subdir={tmp_path / 'f'}"]),
              "hydra.output_subdir=")


def test_empty_run_dir_writes_nothing(tmp_path):
    p = _run_py(["hydra.run.dir=", "workload.max_tokens=2"], tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: hydra.run.dir=''"), p.stderr
    assert list(tmp_path.iterdir()) == []


# 14, 15: the module entry points reuse pipeline=train's checks
def _module(main, argv, capsys, *needles):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err and all(x.startswith("error: ") and "expected" in x for x in err), err
    for n in needles:
        assert any(n in x for x in err), (n, err)


@pytest.mark.parametrize("argv,needle", [
    (['data=["/nonexistent"]'], "data="),
    (["data=[1,2]"], "data[0]=1"),
    (['data=[""]'], "an empty path"),
    (["tokenizer=/nonexistent"], "tokenizer="),
    (["tokenizer=TEXT"], "tokenizer.json"),
    (["vocab_size=-5", "tokenizer=train"], "vocab_size=-5"),
    (["vocab_size=10", "tokenizer=train"], ">= 260"),
])
def test_python_m_synodic_data(argv, needle, tmp_path, capsys):
    from synodic.data.__main__ import main
    (tmp_path / "t.txt").write_text("not a tokenizer\n")
    _module(main, [a.replace("TEXT", str(tmp_path / "t.txt")) for a in argv], capsys, needle)


@pytest.mark.parametrize("argv,needle", [
    (["out=FILE"], "out="),
    (["bogus=1"], "bogus=1: unknown key; expected one of batch_size"),
    (['overrides={"bogus": 1}'], "overrides.bogus=1: unknown key; expected one of"),
    (["seed=99999999999999999999999"], "seed="),
    (["model=nemotron_h_8b"], "model='nemotron_h_8b': the run needs an estimated"),  # before the 8B model is built
    (["batch_size=100000"], "batch_size=100000: the run needs an estimated"),
])
def test_python_m_synodic_train(argv, needle, tmp_path, capsys):
    from synodic.train.__main__ import main
    (tmp_path / "f").write_text("x")
    argv = [a.replace("FILE", str(tmp_path / "f")) for a in argv]
    _module(main, [*argv, *([] if any(a.startswith("out=") for a in argv) else [f"out={tmp_path / 'o'}"])],
            capsys, needle)


# 17: accepted silently before
@no_cuda
def test_cuda_graphs_with_device_auto_without_cuda():
    _one_line(*check(["runtime.cuda_graphs=true"]), "runtime.cuda_graphs=true with runtime.device=auto")


@pytest.mark.parametrize("metric", ["''", "decode_tokens_per_s", "metrics."])
def test_sweep_metric(metric):
    _one_line(*check(["pipeline=sweep", "pipeline.grid={ssm: [eager]}", f"pipeline.metric={metric}"]),
              "pipeline.metric=")


@pytest.mark.parametrize("variant", ["pipeline=decode", "pipeline.steps=3", "workload=chat",
                                     "workload.max_tokens=9"])
def test_bench_variant_that_sets_the_pipeline(variant):
    from synodic.pipelines.bench import _compose_variants
    cfg = compose(["pipeline=bench", f"pipeline.variants=['', '{variant}']"])
    lines = _config_error(lambda: _compose_variants(cfg, []), f"pipeline.variants[1]='{variant}'")
    assert len(lines) == 1


# 18: clearer lines
def test_eval_reference_errors_name_pipeline_reference():
    from synodic.pipelines.eval import reference_config
    cfg = compose(["pipeline=eval", "pipeline.path=decode", "pipeline.reference={ssm: {ring_len: 0}}"])
    lines = _config_error(lambda: reference_config(cfg))
    assert all(x.startswith("pipeline.reference: ssm.ring_len=0") for x in lines), lines


def test_quantize_layers_matching_nothing():
    from synodic.pipelines.quantize import quantize_to_store

    from synodic.models.presets import PRESETS
    from synodic.models.weights import random_model
    model = random_model(PRESETS["tiny_mamba2"], 0, torch.device("cpu"), torch.float32)
    qcfg = compose(["quant=mxfp4", "quant.layers=[zzz]"]).quant
    _config_error(lambda: quantize_to_store(model, qcfg, "/nonexistent", progress=False), "quant.layers=['zzz']",
                  "blocks.*")
    # a typo beside a good pattern: refused too, naming the pattern that matched nothing
    qcfg = compose(["quant=mxfp4", "quant.layers=[blocks.*, blocks.*.mixer.zzz]"]).quant
    lines = _config_error(lambda: quantize_to_store(model, qcfg, "/nonexistent", progress=False),
                          "'blocks.*.mixer.zzz' matched no nn.Linear")
    from synodic.quant.apply import apply_quant
    _config_error(lambda: apply_quant(model, qcfg), *lines)


def test_kind_override_suggests_the_option():
    _one_line(*check(["pipeline.kind=eval"]), "pipeline.kind='eval'", "expected pipeline=eval")


def test_decode_says_when_the_kv_pool_cut_requests_short(tmp_path, capsys):
    """A KV pool too small for the workload ends requests early (finish reasons in results.json); the summary on
    the terminal says so and names the key to raise, instead of a clean-looking run."""
    from synodic.pipelines.decode import run

    from synodic.config.compose import compose
    out = run(compose(["kv.num_blocks=1", "workload.max_tokens=4", "runtime.device=cpu"]), tmp_path)
    early = sum(n for k, n in out["metrics"]["finish_reasons"].items() if "kv_capacity" in k)
    text = capsys.readouterr().out
    assert early > 0 and f"{early} of 4 requests ended early for lack of KV pages" in " ".join(text.split())
    assert "kv.num_blocks=1" in text


def test_train_refuses_a_vocab_override_it_would_replace():
    """pipeline=train sizes the model's vocabulary from its tokenizer; an explicit model.overrides.vocab_size
    would be silently replaced, so it is refused with the key that does set it."""
    _one_line(*check(["pipeline=train", "+model.overrides.vocab_size=300"]), "model.overrides.vocab_size=300",
              "pipeline.vocab_size=300")
    assert check(["pipeline=train", "pipeline.vocab_size=300"]) == (None, [])


def test_train_drafter_rerun_with_other_data_or_schedule_is_refused(tmp_path):
    """A train_drafter rerun in a run directory resumes only what that directory was made for: other data settings
    (the cached sequences), another schedule or scheme (the checkpoint), a damaged cache or checkpoint: one line
    naming the key, exit 2, and the directory's files unchanged."""
    run = tmp_path / "run"
    base = ["pipeline=train_drafter", "pipeline.batch=2", "pipeline.anchors_per_seq=2", "pipeline.eval_prompts=2",
            "pipeline.device=cpu", "runtime.device=cpu", f"hydra.run.dir={run}", "pipeline.prompts=2",
            "pipeline.prompt_len=8", "pipeline.new_tokens=16", "spec=dflash", "pipeline.steps=2"]
    assert _run_py(base, tmp_path).returncode == 0
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "run.log"}

    def refused(extra, *needles):
        p = _run_py([*base, *extra], tmp_path)
        _one_line(p.returncode, p.stderr.strip().splitlines(), *needles)
        assert {p: p.read_bytes() for p in files} == files
    refused(["pipeline.prompts=4"], "pipeline.prompts=4", "made with pipeline.prompts=2")
    refused(["pipeline.steps=4"], "pipeline.steps=4", "2-step schedule")
    refused(["spec=dspark"], "spec=dspark", "another drafter")
    state = run / "ckpt" / "state.json"
    state.write_text("garbage")
    files[state] = b"garbage"
    refused([], "damaged checkpoint")
    cache = run / "data.safetensors"
    cache.write_bytes(cache.read_bytes()[:100])
    files[cache] = cache.read_bytes()
    refused([], "data.safetensors cannot be read")


def test_ctrl_c_is_one_line_and_keeps_an_earlier_result(tmp_path):
    """SIGINT mid-run: one error line (no traceback), exit 130, and the results.json of an earlier run in the same
    directory untouched."""
    import signal
    import time
    run = tmp_path / "run"
    assert _run_py(["workload.max_tokens=2", "runtime.device=cpu", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    before = (run / "results.json").read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SYNODIC_TRACEBACK", None)
    log = run / "run.log"
    size = log.stat().st_size
    p = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "workload.max_tokens=100000", "runtime.device=cpu",
                          f"hydra.run.dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while log.stat().st_size == size and time.time() < deadline:  # the job has started: it logs its model
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert p.returncode == 130 and len(lines) == 1 and lines[0].startswith("error: interrupted"), err[-2000:]
    assert (run / "results.json").read_bytes() == before


@pytest.mark.parametrize("argv", [["runtime=ray", "runtime.address=localhost:notaport"],
                                  ["runtime=ray", "runtime.address=somehost"],
                                  ["runtime=ray", "runtime.address=''"],
                                  ["pipeline=quantize", "quant=mxfp4", "pipeline.ray_address=localhost:99999"],
                                  ["pipeline=sweep", "pipeline.ray_address=ray://h:"]])
def test_ray_address_of_the_wrong_form(argv):
    """Ray's own parse errors were tracebacks (and '' silently meant null)."""
    key = argv[-1].split("=")[0]
    _one_line(*check(argv), f"{key}=", "expected 'auto', 'host:port'")


def test_ray_address_forms_that_pass():
    from synodic.config.netcheck import address_form
    for a in (None, "auto", "10.0.0.1:6379", "ray://head:10001", "[::1]:6379"):
        assert address_form(a) == a


def test_eval_reference_without_a_whole_window(tmp_path):
    """The comparison with a reference scores whole windows: a text or max_tokens shorter than one is refused in
    one line before any scoring (it was a ValueError from the comparison)."""
    (tmp_path / "t.txt").write_text("hello world\n")
    for extra, key in (([f"pipeline.text={tmp_path / 't.txt'}"], "pipeline.text="),
                       (["pipeline.max_tokens=100"], "pipeline.max_tokens=100")):
        p = _run_py(["pipeline=eval", "quant=mxfp4", "pipeline.reference={quant: {kind: none}}", *extra,
                     "runtime.device=cpu", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
        _one_line(p.returncode, p.stderr.strip().splitlines(), key, "hold no window of pipeline.seq_len=2048")


@pytest.mark.parametrize("name,make", [("results.json", "dir"), ("run.log", "dir"), (".synodic.lock", "dir"),
                                       (".hydra", "file")])
def test_run_dir_entry_of_the_wrong_kind(tmp_path, name, make):
    """A directory where the run writes a file (or the reverse) was a traceback mid-run, or after the whole run
    for results.json: refused before Hydra starts."""
    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if make == "dir" else (run / name).write_text("x")
    _one_line(*check(["workload.max_tokens=2", f"hydra.run.dir={run}"]), "hydra.run.dir=", f"{name} there is a")


def test_store_and_cache_paths_of_the_wrong_kind(tmp_path, monkeypatch):
    """The quantization store's root and entry must be directories and an entry's lock a file; the token cache
    ($SYNODIC_CACHE) a directory: refused in one line naming where the path came from (tracebacks before)."""
    from synodic.pipelines.quantize import _check_store_paths

    from synodic.data.prepare import cache_root
    f = tmp_path / "f"
    f.write_text("x")
    entry = tmp_path / "store" / "abc"
    entry.parent.mkdir()
    _check_store_paths(str(entry.parent), entry, entry.with_name(".abc.lock"))  # nothing there yet: fine
    entry.write_text("x")
    lines = _config_error(lambda: _check_store_paths(str(entry.parent), entry, entry.with_name(".abc.lock")),
                          "pipeline.store=", "abc is a file; expected a directory")
    entry.unlink()
    entry.with_name(".abc.lock").mkdir()
    _config_error(lambda: _check_store_paths(None, entry, entry.with_name(".abc.lock")), "is a directory; expected "
                  "a file")
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(f))
    _config_error(lambda: _check_store_paths(None, f / "abc", f / ".abc.lock"), "SYNODIC_QUANT_STORE=")
    monkeypatch.setenv("SYNODIC_CACHE", str(f))
    _config_error(cache_root, "SYNODIC_CACHE=", "is a file; expected a directory")
    monkeypatch.setenv("SYNODIC_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    assert len(lines) == 1


@pytest.mark.parametrize("argv,key", [(["kv.top_k=100000000"], "kv.top_k="),
                                      (["kv=hisparse", "kv.hot_buffer=100000000"], "kv.hot_buffer="),
                                      (["pipeline=quantize", "quant=mxfp4", "pipeline.threads=100000"],
                                       "pipeline.threads="),
                                      (["quant=nvfp4", "quant.iters=100000000"], "quant.iters="),
                                      (["quant=mxfp4", "quant.method=smoothquant", "quant.calib_samples=100000"],
                                       "quant.calib_samples=")])
def test_values_past_any_sensible_bound(argv, key):
    """A segfault (threads), minutes of silence (top_k, iters) or a MemoryError (calibration) before."""
    _one_line(*check(argv), key, "expected a value <=")


def test_a_drafter_of_another_model_kind_is_refused(tmp_path):
    """tiny_gdn's drafter has tiny_mamba2's shapes, so it loaded on tiny_mamba2 and accepted nothing: its
    config.json's target_kind is checked before the target loads."""
    d = ROOT / "synodic" / "assets" / "drafters" / "tiny_gdn" / "dflash"
    p = _run_py(["spec=dflash", f"spec.drafter={d}", "workload.max_tokens=2", "runtime.device=cpu",
                 f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    _one_line(p.returncode, p.stderr.strip().splitlines(), "trained for model=tiny_gdn", "model=tiny_mamba2")


def test_a_kv_pool_that_holds_no_request_is_an_error(tmp_path):
    """Every request rejected for KV capacity used to end with exit 0 and no tokens: one line, exit 2, and the
    results.json that says which requests and why."""
    run = tmp_path / "run"
    p = _run_py(["kv.num_blocks=1", "kv.block_size=1", "workload.max_tokens=4", "runtime.device=cpu",
                 f"hydra.run.dir={run}"], tmp_path)
    _one_line(p.returncode, p.stderr.strip().splitlines(), "kv.num_blocks=1: the KV pool holds none")
    doc = json.loads((run / "results.json").read_text())
    assert doc["incomplete"]["at"] == "kv.num_blocks"
    assert {r["finish_reason"] for r in doc["requests"]} == {"rejected_kv_capacity"}


# 19: options that would be silently ignored: rates without controlled acceptance, a forward-pass comparison of
# what the forward pass does not run
def test_acceptance_rates_need_controlled_acceptance():
    _one_line(*check(["pipeline=bench", "pipeline.acceptance_rates=[0.5]"]), "pipeline.acceptance_rates=[0.5]",
              "pipeline.acceptance=controlled or forced")
    assert check(["pipeline=bench", "pipeline.acceptance=forced", "pipeline.acceptance_rates=[0.5]"]) == (None, [])


@pytest.mark.parametrize("ref", ["{ssm: {kind: replay}}", "{kv: {kind: hisparse}}"])
def test_eval_reference_of_what_forward_does_not_run(ref):
    _one_line(*check(["pipeline=eval", f"pipeline.reference={ref}"]), "pipeline.path=forward",
              "pipeline.path=decode")
    assert check(["pipeline=eval", f"pipeline.reference={ref}", "pipeline.path=decode"]) == (None, [])


def test_bench_variants_that_repeat_one_another():
    from synodic.pipelines.bench import _compose_variants
    cfg = compose(["pipeline=bench", "pipeline.variants=['ssm=replay', 'ssm=eager', ' ssm=replay ']"])
    lines = _config_error(lambda: _compose_variants(cfg, []), "pipeline.variants[2]=' ssm=replay '",
                          "expected distinct variants")
    assert len(lines) == 1


def test_new_key_in_a_mapping_field_names_the_plus_form():
    _one_line(*check(["model.overrides.hidden_size=64"]), "model.overrides is a mapping",
              "expected +model.overrides.hidden_size=64")
    _one_line(*check(["model.dtype.x=7"]), "unknown key")  # not a mapping: the plain line


def test_synthetic_requests_that_do_not_fit_in_host_memory():
    from synodic.config.budget import check_fits
    cfg = compose(["workload=chat", "workload.num_requests=100000000", "runtime.device=cpu"])
    _config_error(lambda: check_fits(cfg, torch.device("cpu")), "workload.num_requests=100000000",
                  "workload requests")
    check_fits(compose(["workload=chat", "workload.num_requests=1000", "runtime.device=cpu"]), torch.device("cpu"))
