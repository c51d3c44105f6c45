"""Two processes on one run directory or one quantization-store entry: the second fails at once with one
line naming the key; the lock is free again when the first ends."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synodic.config.errors import ConfigError
from synodic.results.locks import exclusive

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time\nfrom synodic.results.locks import exclusive\n"
        "with exclusive(sys.argv[1], 'k', 'v'):\n    print('held', flush=True)\n    time.sleep(60)\n")


@pytest.fixture
def holder(tmp_path):
    procs = []

    def hold(lock: Path):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p
    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_second_process_is_refused_then_served(tmp_path, holder):
    lock = tmp_path / "run" / ".synodic.lock"
    p = holder(lock)
    with pytest.raises(ConfigError, match=r"hydra.run.dir=.*another synodic process"):
        with exclusive(lock, "hydra.run.dir", tmp_path / "run"):
            pass
    p.kill()
    p.wait()
    with exclusive(lock, "hydra.run.dir", tmp_path / "run"):   # released when its holder died
        pass


def test_run_py_on_a_busy_run_dir_exits_2(tmp_path, holder):
    run_dir = tmp_path / "run"
    holder(run_dir / ".synodic.lock")
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), f"hydra.run.dir={run_dir}", "runtime.device=cpu",
                        "workload.max_tokens=1"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: hydra.run.dir=") and "Traceback" not in r.stderr
    assert not (run_dir / "results.json").exists()


def test_temporary_names_are_unique(tmp_path):
    from synodic.quant.store import _tmp
    names = {_tmp(tmp_path / "part.safetensors").name for _ in range(50)}
    assert len(names) == 50
