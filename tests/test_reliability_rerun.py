"""A rerun in a run directory keeps the `.hydra/` files that the directory's results.json was made from
until the rerun itself succeeds (synodic/config/hydra_dirs.py): a failed rerun leaves them as they were,
a successful one replaces them with its own, written after its results.json."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(argv, run_dir: Path, cwd: Path):
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *argv, f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_failed_rerun_keeps_hydra_files_and_a_good_one_replaces_them(tmp_path):
    d = tmp_path / "run"
    hyd = d / ".hydra"
    hyd.mkdir(parents=True)
    old = {"config.yaml": "original: config\n", "hydra.yaml": "hydra: {original: true}\n",
           "overrides.yaml": "- original=1\n"}
    for k, v in old.items():
        (hyd / k).write_text(v)
    (d / "results.json").write_text(json.dumps({"made_from": "the original .hydra"}))

    bad = run(["runtime.max_slots=100000"], d, tmp_path)  # passes Hydra, refused by the memory check
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "runtime.max_slots" in bad.stderr and "Traceback" not in bad.stderr
    assert {k: (hyd / k).read_text() for k in old} == old
    assert len([ln for ln in bad.stderr.splitlines() if "runtime.max_slots" in ln]) == 1  # not echoed by logging
    assert "runtime.max_slots" in (d / "run.log").read_text()  # but in Hydra's run.log
    assert json.loads((d / "results.json").read_text()) == {"made_from": "the original .hydra"}

    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n")
    good = run([f"workload.path={prompts}", "workload.max_tokens=2"], d, tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    assert "workload.max_tokens=2" in (hyd / "overrides.yaml").read_text()
    assert "max_tokens: 2" in (hyd / "config.yaml").read_text()
    assert "output_subdir: .hydra" in (hyd / "hydra.yaml").read_text()  # as asked, not the null used meanwhile
    assert json.loads((d / "results.json").read_text())["config"]["workload"]["max_tokens"] == 2
    assert not list(hyd.glob(".*tmp*"))
    assert "results: " in (d / "run.log").read_text()


def test_fresh_directory_gets_hydra_files_at_job_start(tmp_path):
    d = tmp_path / "fresh"
    bad = run(["runtime.max_slots=100000"], d, tmp_path)
    assert bad.returncode == 2
    assert (d / ".hydra" / "overrides.yaml").is_file()  # Hydra's usual write: nothing to protect here
