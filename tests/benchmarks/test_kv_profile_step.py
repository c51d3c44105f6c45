"""benchmarks.kv_profile_step on the CPU smoke shape: one policy's decode steps are timed, the chosen step is
profiled into a readable per-op table, and bad arguments fail with one line."""
import json

import pytest

from benchmarks.kv_profile_step import main


def test_profile_step_smoke(tmp_path):
    steps = main(["--smoke", "--out", str(tmp_path), "--policies", "hisparse", "--output-len", "4",
                  "--profile-step", "1", "--prompt-len", "64", "--requests", "2"])
    assert list(steps) == ["hisparse"] and len(steps["hisparse"]) == 3  # output_len - 1 decode steps
    table = (tmp_path / "profile_hisparse.txt").read_text()
    assert "aten::" in table and "Self CPU" in table
    saved = json.loads((tmp_path / "steps.json").read_text())
    assert saved["step_ms"] == steps and saved["args"]["pool_fraction"] == 0.75


def test_profile_step_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--smoke", "--out", str(tmp_path), "--policies", "paged"])
    assert e.value.code == 2 and "argument --policies: unknown" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--smoke", "--out", str(tmp_path), "--profile-step", "9", "--output-len", "4"])
    assert e.value.code == 2 and "argument --profile-step: 9" in capsys.readouterr().err
