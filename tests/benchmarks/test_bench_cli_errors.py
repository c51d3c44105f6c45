"""Bad arguments to the benchmark entry points: argparse's usage plus ONE error line naming the argument and the
value, exit code 2, no traceback, and no output file or directory created. Every case stops before any model runs."""
import subprocess

import pytest

from benchmarks import (
    closed_gate,
    drafter_acceptance,
    hf_load,
    kv_locality,
    kv_long,
    kv_long_spec,
    kv_measure,
    kv_profile_step,
    kv_window,
    ray_scaling,
    spec_decode,
    spec_profile,
    spec_targets,
    sps_profile,
    ssm_decode,
)


def error_line(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    # everything else is argparse's (possibly wrapped) usage
    assert all(line.startswith(("usage:", " ")) for line in err.splitlines() if line not in errors), err
    return errors[0]


CASES = {
    "sps_profile --tokens abc": (sps_profile.main, ["--tokens", "abc"], ["--tokens", "'abc'", "integers >= 1"]),
    "sps_profile --tokens 0,-1": (sps_profile.main, ["--tokens", "0,-1"], ["--tokens", "'0,-1'"]),
    "sps_profile --reps 0": (sps_profile.main, ["--reps", "0"], ["--reps", "'0'"]),
    "sps_profile model=zzz": (sps_profile.main, ["model=zzz", "--tokens", "8", "--reps", "1"],
                              ["model='zzz'", "expected one of", "tiny_mamba2"]),
    "spec_decode --models zzz": (spec_decode.main, ["--smoke", "--models", "zzz"],
                                 ["--models", "model='zzz'", "expected one of"]),
    "spec_decode --specs bogus": (spec_decode.main, ["--smoke", "--specs", "bogus"],
                                  ["--specs", "spec='bogus'", "expected one of"]),
    "spec_decode --batches 0": (spec_decode.main, ["--smoke", "--batches", "0"], ["--batches", "'0'", ">= 1"]),
    "spec_decode --repeats x": (spec_decode.main, ["--smoke", "--repeats", "x"], ["--repeats", "'x'"]),
    "spec_profile --model zzz": (spec_profile.main, ["--model", "zzz"], ["--model", "model='zzz'", "expected"]),
    "spec_profile --batch -3": (spec_profile.main, ["--batch", "-3"], ["--batch", "'-3'", ">= 1"]),
    "spec_profile --census --specs bogus": (spec_profile.main, ["--census", "--specs", "dflash2", "bogus"],
                                            ["--specs", "spec='bogus'"]),
    "kv_measure --loads abc": (kv_measure.main, ["--loads", "abc"], ["--loads", "'abc'", "numbers > 0"]),
    "kv_measure --top-k -1": (kv_measure.main, ["--top-k", "-1"], ["--top-k", "'-1'", ">= 1"]),
    "kv_measure --requests 0": (kv_measure.main, ["--requests", "0", "--steps", "1"], ["--requests", "'0'"]),
    "hf_load --preset zzz": (hf_load.main, ["--dir", "{tmp}/hfx", "--preset", "zzz"],
                             ["--preset", "'zzz'", "expected one of", "nemotron_h_8b"]),
    "hf_load --dir FILE": (hf_load.main, ["--dir", "{tmp}/a_file", "--preset", "tiny_mamba2"],
                           ["--dir", "a_file", "expected a directory"]),
    "hf_load --reps 0": (hf_load.main, ["--dir", "{tmp}/hfx", "--reps", "0"], ["--reps", "'0'"]),
    "ray_scaling --replicas 0": (ray_scaling.main, ["--replicas", "0"], ["--replicas", "'0'", ">= 1"]),
    "ray_scaling --model zzz": (ray_scaling.main, ["--model", "zzz"], ["--model", "model='zzz'"]),
    "kv_long --out MISSING/x.json": (kv_long.main, ["--smoke", "--out", "{tmp}/missing/x.json"],
                                     ["--out", "missing/x.json", "existing directory"]),
    "kv_long --out DIR": (kv_long.main, ["--smoke", "--out", "{tmp}"], ["--out", "it is a directory"]),
    "kv_long --prompt-len 0": (kv_long.main, ["--smoke", "--prompt-len", "0"], ["--prompt-len", "'0'"]),
    "kv_long --model zzz": (kv_long.main, ["--smoke", "--model", "zzz"], ["--model", "model='zzz'"]),
    "kv_long_spec --rates abc": (kv_long_spec.main, ["--smoke", "--rates", "abc"], ["--rates", "'abc'", "[0, 1]"]),
    "kv_long_spec --out MISSING": (kv_long_spec.main, ["--smoke", "--out", "{tmp}/missing/x.json"], ["--out"]),
    "closed_gate --batches 0": (closed_gate.main, ["--batches", "0"], ["--batches", "'0'"]),
    "closed_gate --schemes bogus": (closed_gate.main, ["--schemes", "bogus"], ["--schemes", "spec='bogus'"]),
    "ssm_decode --batches 1,x": (ssm_decode.main, ["--batches", "1,x"], ["--batches", "'1,x'"]),
    "kv_window --weights": (kv_window.main, ["--smoke", "--weights", "/nonexistent"], ["--weights", "/nonexistent"]),
    "kv_window --steps 0": (kv_window.main, ["--smoke", "--steps", "0"], ["--steps", "'0'", "integer >= 1"]),
    "kv_window --gamma 0": (kv_window.main, ["--smoke", "--gamma", "0"], ["--gamma", "'0'"]),
    "kv_profile_step --policies": (kv_profile_step.main, ["--smoke", "--policies", "bogus"], ["--policies", "bogus"]),
    "kv_profile_step --profile-step": (kv_profile_step.main, ["--smoke", "--profile-step", "100000"],
                                       ["--profile-step", "100000"]),
    "kv_profile_step --pool-fraction": (kv_profile_step.main, ["--smoke", "--pool-fraction", "-1"],
                                        ["--pool-fraction", "(0, 1]"]),
    "kv_locality --tokens 0": (kv_locality.main, ["--tokens", "0"], ["--tokens", "out of range"]),
    "drafter_acceptance --gamma 3": (drafter_acceptance.main, ["--gamma", "3"], ["--gamma", "3", "expected --gamma 7"]),
    "drafter_acceptance --models zzz": (drafter_acceptance.main, ["--models", "zzz"], ["--models", "'zzz'"]),
    "drafter_acceptance --schemes bogus": (drafter_acceptance.main, ["--schemes", "bogus"], ["--schemes", "'bogus'"]),
    "spec_targets --budget-s 0": (spec_targets.main, ["--budget-s", "0"], ["--budget-s", "'0'", "a number > 0"]),
    "drafter_acceptance --prompts 0": (drafter_acceptance.main, ["--prompts", "0"], ["--prompts", "'0'"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument_is_one_line_exit_2(case, tmp_path, capsys):
    main, argv, expected = CASES[case]
    (tmp_path / "a_file").write_text("not a directory\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    # (sps_profile has no --out: it writes nothing here; kv_profile_step's --out is a directory)
    if "--out" not in argv and main not in (sps_profile.main, kv_profile_step.main):
        argv += ["--out", str(tmp_path / "out.json")]
    before = sorted(p.name for p in tmp_path.iterdir())
    line = error_line(capsys, main, argv)
    for word in expected:
        assert word in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no directory created


def test_ray_scaling_keeps_run_py_exit_2(tmp_path, monkeypatch, capsys):
    """run.py's own one-line error for bad input (exit 2) ends the benchmark with exit 2 too, not 1."""
    def fake_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 2, "", "error: runtime.replicas=0: expected >= 1\n")
    monkeypatch.setattr(ray_scaling.subprocess, "run", fake_run)
    with pytest.raises(SystemExit) as e:
        ray_scaling.main(["--replicas", "1", "--out", str(tmp_path / "rs.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runtime.replicas=0" in err[0]
    assert not (tmp_path / "rs.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the message is for a machine without CUDA")
def test_window_flush_without_cuda_or_the_interpreter(tmp_path, monkeypatch, capsys):
    from benchmarks import window_flush
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    line = error_line(capsys, window_flush.main, ["--out", str(tmp_path / "w.json")])
    assert "need a CUDA GPU" in line and "TRITON_INTERPRET=1" in line
    assert not (tmp_path / "w.json").exists()
