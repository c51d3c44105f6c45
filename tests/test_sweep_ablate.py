"""pipeline=sweep on Ray Tune (a killed trial retried, a rerun runs nothing finished, a bad trial stops the
sweep before it starts), Hydra multirun validation, and pipeline=ablate's rows, Δconfig, ratios and env rule."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from synodic.pipelines.ablate import rows_of, table

from synodic.config.errors import ConfigError
from synodic.distributed.sweep import expand_grid, run_sweep, validate_trials

ROOT = Path(__file__).resolve().parents[1]
BASE = ["runtime.device=cpu", "workload.max_tokens=2", "pipeline=decode"]


def test_grid_expansion_and_a_bad_trial_refuse_the_sweep():
    assert expand_grid({"ssm": ["eager", "replay"], "quant": ["none", "mxfp4"]}, ["a=1"]) == [
        ["a=1", "ssm=eager", "quant=none"], ["a=1", "ssm=eager", "quant=mxfp4"],
        ["a=1", "ssm=replay", "quant=none"], ["a=1", "ssm=replay", "quant=mxfp4"]]
    assert expand_grid(["ssm=replay quant=mxfp4", ["kv=hisparse"]], []) == [["ssm=replay", "quant=mxfp4"],
                                                                          ["kv=hisparse"]]
    with pytest.raises(ConfigError) as e:
        validate_trials(expand_grid({"ssm.ring_len": [8, 1]}, [*BASE, "ssm=replay"]), "pipeline.grid")
    assert len(e.value.lines) == 1 and "trial 1" in e.value.lines[0] and "ssm.ring_len=1" in e.value.lines[0]
    with pytest.raises(ConfigError) as e:  # Hydra's own error for a trial, in synodic's one-line form
        validate_trials(expand_grid({"spec": ["none", "bogus"]}, BASE), "pipeline.grid")
    assert e.value.lines == [f"pipeline.grid: trial 1 ({' '.join([*BASE, 'spec=bogus'])}): spec='bogus': unknown "
                             "option; expected one of dflash, dflash2, dspark, ngram, none"]
    with pytest.raises(ConfigError) as e:  # a trial's own Ray address would be ignored: trials run on the sweep's
        validate_trials([[*BASE, "runtime=ray", "runtime.replicas=1", "runtime.address=10.0.0.1:6379"]],
                        "pipeline.grid")
    assert len(e.value.lines) == 1 and "a Ray address ('10.0.0.1:6379') inside a sweep" in e.value.lines[0]


def test_multirun_with_a_bad_job_fails_before_the_first_job():
    p = subprocess.run([sys.executable, "run.py", "-m", "ssm=replay", "ssm.ring_len=8,1", "runtime.device=cpu"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == [
        ln for ln in p.stderr.splitlines() if "job 1" in ln]


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_sweep_retries_a_killed_trial_and_resumes_without_rerunning(tmp_path, ray_instance):
    trials = validate_trials(expand_grid({"ssm": ["eager", "replay"], "model": ["tiny_mamba2", "tiny_gdn"],
                                          "workload.max_tokens": [2, 3]}, BASE[:1] + BASE[2:]), "pipeline.grid")
    trials = trials[:6]
    victim = tmp_path / "trials" / trials[2].config_hash / "worker.pid"
    killed = []

    def kill_once():  # the victim trial's worker, once it has started
        t0 = time.monotonic()
        while not victim.exists() and time.monotonic() - t0 < 240:
            time.sleep(0.05)
        if victim.exists():
            os.kill(int(victim.read_text()), signal.SIGKILL)
            killed.append(True)
    th = threading.Thread(target=kill_once)
    th.start()
    rows = run_sweep(trials, tmp_path, cpus=1, gpus=0, max_failures=2, max_concurrent=2, ray_address=None)
    th.join()
    assert killed
    assert [r["status"] for r in rows] == ["done"] * 6
    docs = [tmp_path / "trials" / t.config_hash / "results.json" for t in trials]
    assert all(d.exists() for d in docs)
    stamps = [d.stat().st_mtime_ns for d in docs]
    rows2 = run_sweep(trials, tmp_path, cpus=1, gpus=0, max_failures=2, max_concurrent=2, ray_address=None)
    assert [r["status"] for r in rows2] == ["done"] * 6
    assert [d.stat().st_mtime_ns for d in docs] == stamps  # nothing finished ran again


def _doc(cfg: dict, tps: float, device="cpu", steps=10):
    return {"config": cfg, "metrics": {"decode_tokens_per_s": tps, "decode_s": steps / tps},
            "ledger": {"decode_steps": steps, "bytes_per_step": {"weights_read": 100}},
            "env": {"device": device, "device_name": "x", "torch": "t", "triton": "r", "git_commit": "c"}}


def _independent_diff(a, b, prefix=""):
    """The test's own diff of two nested dicts (recursion written apart from synodic.results.diff)."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict) and (x or y):
            out += _independent_diff(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}: {x!r} → {y!r}")
    return out


def test_ablation_rows_delta_config_ratios_and_env_rule():
    study = {"base": ["ssm=eager"], "arms": [{"name": "A", "overrides": ["ssm=replay"]},
                                             {"name": "B", "overrides": ["quant=mxfp4"]}]}
    rows = rows_of(study, ["model=tiny_gdn"], "both")
    assert [(r["mode"], r["name"], r["ref"]) for r in rows] == [
        ("cumulative", "base", None), ("cumulative", "+ A", 0), ("cumulative", "+ B", 1),
        ("leave_one_out", "full", None), ("leave_one_out", "- A", 3), ("leave_one_out", "- B", 3)]
    assert rows[2]["overrides"] == ["ssm=eager", "model=tiny_gdn", "ssm=replay", "quant=mxfp4"]
    assert rows[4]["overrides"] == ["ssm=eager", "model=tiny_gdn", "quant=mxfp4"]
    from synodic.config.compose import compose
    dumps = [compose(["runtime.device=cpu", *r["overrides"]]).model_dump(mode="json") for r in rows]
    docs = [_doc(d, tps) for d, tps in zip(dumps, [10.0, 15.0, 30.0, 30.0, 12.0, 15.0])]
    tab = table(rows, docs, [None] * 6, allow_mixed_env=False)
    assert tab[1]["delta_config"] == "; ".join(_independent_diff(dumps[0], dumps[1]))
    assert tab[5]["delta_config"] == "; ".join(_independent_diff(dumps[3], dumps[5]))
    assert tab[2]["tokens_per_s_vs_base"] == pytest.approx(3.0) and tab[2]["tokens_per_s_vs_prev"] == 2.0
    assert tab[4]["tokens_per_s_vs_base"] == pytest.approx(0.4)  # the full config is leave-one-out's base
    docs[2]["env"]["device_name"] = "another GPU"
    refused = table(rows, docs, [None] * 6, allow_mixed_env=False)[2]
    assert "decode_tokens_per_s" not in refused and refused["env"] == "differs: device_name"
    flagged = table(rows, docs, [None] * 6, allow_mixed_env=True)[2]
    assert flagged["decode_tokens_per_s"] == 30.0 and flagged["env"] == "differs: device_name"


def test_ablate_pipeline_end_to_end(tmp_path, ray_instance):
    study = tmp_path / "tiny.yaml"
    study.write_text("base: [ssm=eager, workload.max_tokens=2]\narms:\n  - {name: replay, overrides: [ssm=replay]}\n")
    from synodic.pipelines.ablate import run

    from synodic.config.compose import compose
    # mode=both (the default): leave-one-out's rows are the cumulative ones' configs, run once each
    cfg = compose(["runtime.device=cpu", "pipeline=ablate", f"pipeline.study={study}", "pipeline.max_concurrent=2"])
    out = run(cfg, tmp_path)
    assert [r["arm"] for r in out["rows"]] == ["base", "+ replay", "full", "- replay"]
    assert all(r["status"] == "done" for r in out["rows"])
    assert len(list((tmp_path / "trials").iterdir())) == 2
    assert "ssm.kind: 'eager' → 'replay'" in out["rows"][1]["delta_config"]
    assert "ssm.kind: 'replay' → 'eager'" in out["rows"][3]["delta_config"]
    for f in ("ablation.md", "ablation.csv", "ablation.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert json.loads((tmp_path / "grid.json").read_text())


def test_a_trial_asking_for_more_than_the_cluster_has_is_refused_up_front():
    """Tune would wait forever for a GPU that no node has: refused in one line naming the key."""
    from synodic.config.errors import ConfigError
    from synodic.distributed.sweep import _check_fits
    _check_fits({"CPU": 4.0}, 1, 0)
    for have, cpus, gpus, key in (({"CPU": 4.0}, 1, 1, "pipeline.gpus=1"), ({"CPU": 2.0, "GPU": 1.0}, 3, 1,
                                                                           "pipeline.cpus=3")):
        with pytest.raises(ConfigError) as e:
            _check_fits(have, cpus, gpus)
        assert len(e.value.lines) == 1 and e.value.lines[0].startswith(key) and "expected" in e.value.lines[0]


def test_failed_trials_keep_the_table_and_fail_the_run():
    """A sweep with a failed trial is not a finished sweep: its rows are kept (PartialResults) and the run exits
    non-zero; a sweep whose trials all finished returns as usual."""
    from synodic.config.errors import PartialResults
    from synodic.distributed.sweep import TrialsFailed, check_trials
    done = {"overrides": "ssm=eager", "status": "done", "error": ""}
    check_trials([done], {}, "pipeline.grid")
    out = {"trials": []}
    with pytest.raises(PartialResults) as e:
        check_trials([done, {"overrides": "ssm=replay", "status": "failed", "error": "ValueError: x"}], out,
                     "pipeline.grid")
    assert isinstance(e.value.cause, TrialsFailed) and e.value.where == "pipeline.grid"
    assert "1 of 2 trials failed (first: ssm=replay: ValueError: x)" in str(e.value.cause)
    assert e.value.payload is out and out["incomplete"]["at"] == "pipeline.grid"
