"""runtime=ray on a local Ray instance with CPU replicas: the same greedy outputs as runtime=local, every
request served exactly once, a killed replica's requests served again, no hang when every replica is gone,
and bad input refused in one line before any actor starts."""
import os
import signal
import subprocess
import sys
import time

import pytest
from synodic.pipelines.decode import serve

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.distributed.replicas import LOST, RayExecutor
from synodic.engine.request import Request, SamplingParams

ray = pytest.importorskip("ray")
PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9, [7, 7, 8], [1, 2, 3, 4, 5, 6], [300], [11, 12], [9, 8, 7, 6]]


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)  # shared by the module's runs
    yield
    ray.shutdown()


def _reqs(n_tokens=8):
    return [Request(i, p, SamplingParams(max_tokens=n_tokens)) for i, p in enumerate(PROMPTS)]


def _cfg(*over):
    return compose(["runtime.device=cpu", "runtime.max_slots=4", *over])


def _local(preset):
    _, _, reqs = serve(_cfg(f"model={preset}"), requests=_reqs(), progress=False)
    return {r.id: r.output_ids for r in reqs}


@pytest.mark.parametrize("preset,replicas,router", [("tiny_mamba2", 2, "least_loaded"),
                                                     ("tiny_gdn", 3, "round_robin")])
def test_replicas_match_local_and_serve_each_request_once(preset, replicas, router):
    want = _local(preset)
    cfg = _cfg(f"model={preset}", "runtime=ray", f"runtime.replicas={replicas}", f"runtime.router={router}")
    got = RayExecutor(cfg).serve(_reqs(), max_seq_len=64, max_running=4)
    assert {r.id: r.output_ids for r in got.requests} == want
    assert all(r.finish_reason == "length" for r in got.requests)
    per = [s["requests"] for s in got.engine.replicas]
    assert len(per) == replicas and sum(per) == len(PROMPTS)  # exactly once each
    assert min(per) >= 1  # every replica took work
    assert got.engine.ledger.tokens == sum(s["decode_tokens"] for s in got.engine.replicas)


def test_killed_replica_requests_are_served_again():
    want = _local("tiny_mamba2")
    cfg = _cfg("runtime=ray", "runtime.replicas=2", "runtime.max_restarts=1")
    killed = []

    def kill_first(index, chunk, pids):
        if not killed:
            os.kill(pids[index], signal.SIGKILL)  # the chunk just sent there fails, mid-run
            killed.append(index)
    got = RayExecutor(cfg, on_dispatch=kill_first).serve(_reqs(), max_seq_len=64, max_running=4)
    assert killed
    assert {r.id: r.output_ids for r in got.requests} == want
    assert all(r.finish_reason == "length" for r in got.requests)


def test_every_replica_lost_ends_without_a_hang():
    cfg = _cfg("runtime=ray", "runtime.replicas=2", "runtime.max_restarts=0")

    def kill_all(index, chunk, pids):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    t0 = time.monotonic()
    got = RayExecutor(cfg, on_dispatch=kill_all).serve(_reqs(), max_seq_len=64, max_running=4)
    assert time.monotonic() - t0 < 120
    assert all(r.done for r in got.requests)
    assert {r.finish_reason for r in got.requests} == {LOST}


@pytest.mark.parametrize("over,needle", [
    (["runtime.replicas=null"], "runtime.replicas=null"),
    (["runtime.replicas=2", "runtime.device=cuda"], "runtime.device='cuda'"),
    (["runtime.replicas=2", "runtime.address=127.0.0.1:9"], "runtime.address='127.0.0.1:9'"),
])
def test_bad_cluster_requests_fail_before_any_actor(over, needle):
    cfg = _cfg("runtime=ray", *over)
    if "runtime.address" in needle:
        ray.shutdown()  # an address is only probed when this process starts Ray itself
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as e:
            RayExecutor(cfg).serve(_reqs(), max_seq_len=64)
        assert needle in e.value.lines[0] and time.monotonic() - t0 < 20
    finally:
        if not ray.is_initialized():
            ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)


@pytest.mark.parametrize("over,needle", [
    ("runtime.replicas=0", "runtime.replicas=0"),
    ("runtime.gpus_per_replica=2", "runtime.gpus_per_replica=2"),
    ("pipeline=eval", "runtime=ray with pipeline=eval"),
])
def test_bad_runtime_fields_exit_2_in_one_line(over, needle):
    p = subprocess.run([sys.executable, "run.py", "runtime=ray", over], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr


def test_decode_pipeline_on_ray_with_speculation(tmp_path):
    """pipeline=decode end to end on replicas: results.json's spec section is the replicas' counters summed, and
    the outputs are the local run's."""
    from synodic.pipelines.decode import run
    spec = ("spec=ngram", "spec.gate=off")  # (a gate's choices follow each process's step times)
    local = _cfg("model=tiny_mamba2", *spec, "workload.max_tokens=12")
    ray_cfg = _cfg("model=tiny_mamba2", *spec, "workload.max_tokens=12", "runtime=ray", "runtime.replicas=2")
    want, got = run(local, tmp_path / "local"), run(ray_cfg, tmp_path / "ray")
    assert [r["output_ids"] for r in got["requests"]] == [r["output_ids"] for r in want["requests"]]
    assert got["spec"]["emitted_tokens"] == want["spec"]["emitted_tokens"] > 0
    assert got["spec"]["drafter"] == want["spec"]["drafter"] and got["spec"]["accepted_tokens"] > 0
    assert len(got["replicas"]) == 2


BENCH = ["pipeline=bench", "model=tiny_mamba2", "pipeline.batch_sizes=[1,3]", "pipeline.prompt_len=4",
         "pipeline.steps=3", "pipeline.warmup=1", "pipeline.stagger=2", "pipeline.repeats=2"]


def test_bench_on_ray_reports_each_replica_and_their_sum(tmp_path):
    """pipeline=bench on 2 replicas: each replica times every point on the local bench's requests (the same greedy
    tokens, the same bytes per step), the combined row is the sum of the replicas', and the per-replica section
    (results and bench_replicas.csv) says what each served."""
    import csv

    from synodic.pipelines.bench import run
    for d in ("local", "ray"):
        (tmp_path / d).mkdir()
    local = run(_cfg(*BENCH), tmp_path / "local")
    got = run(_cfg(*BENCH, "runtime=ray", "runtime.replicas=2"), tmp_path / "ray")
    assert "replicas" not in local and len(got["replicas"]) == 2
    for rep in got["replicas"]:
        assert rep["device"] == "cpu" and rep["requests"] == (1 + 3) * 2  # batch sizes x repeats
        assert [r["batch"] for r in rep["bench"]] == [1, 3]
        assert rep["tokens_per_s"] == max(r["tokens_per_s"] for r in rep["bench"]) > 0
        for mine, ref in zip(rep["bench"], local["bench"]):
            assert mine["outputs_sha1"] == ref["outputs_sha1"]  # the local run's greedy tokens
            assert {k: v for k, v in mine.items() if k.startswith("bytes_")} == \
                {k: v for k, v in ref.items() if k.startswith("bytes_")}
    for i, row in enumerate(got["bench"]):
        mine = [rep["bench"][i] for rep in got["replicas"]]
        assert (row["replicas"], row["batch_total"]) == (2, 2 * row["batch"])
        assert row["tokens_per_s"] == pytest.approx(sum(m["tokens_per_s"] for m in mine))
        assert row["GB_per_s"] == pytest.approx(sum(m["GB_per_s"] for m in mine))
        for k in (k for k in row if k.startswith("bytes_")):  # the combined ledger: the replicas' summed
            assert row[k] == sum(m[k] for m in mine) == 2 * local["bench"][i][k]
        assert row["step_ms"] == max(m["step_ms"] for m in mine)
        assert row["outputs_sha1"] == local["bench"][i]["outputs_sha1"]
    assert got["metrics"]["decode_tokens_per_s"] == max(r["tokens_per_s"] for r in got["bench"])
    per = list(csv.DictReader(open(tmp_path / "ray" / "bench_replicas.csv")))
    assert [(r["replica"], r["batch"]) for r in per] == [("0", "1"), ("0", "3"), ("1", "1"), ("1", "3")]
    assert "batch_total" in (tmp_path / "ray" / "bench.md").read_text()


def test_bench_variant_moving_the_replicas_exits_2_before_ray_starts():
    over = ["pipeline=bench", "runtime=ray", "runtime.replicas=2", "runtime.device=cpu",
            "pipeline.variants=['','runtime.replicas=3']"]
    p = subprocess.run([sys.executable, "run.py", *over], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert p.returncode == 2, p.stderr
    err = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "pipeline.variants[1]='runtime.replicas=3'" in err[0] and "runtime.replicas" in err[0]
    assert "Started a local Ray instance" not in p.stderr and "Traceback" not in p.stderr


def test_replica_threads_are_capped_at_the_machines_cores():
    import os

    from synodic.distributed.replicas import _threads
    assert _threads(1) == 1 and _threads(10 ** 6) == (os.cpu_count() or 1)
