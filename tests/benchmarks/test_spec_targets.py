"""benchmarks.spec_targets: the target runs BENCHMARKS.md cites stay valid commands (every run's config and each
bench variant compose), a broken one is named, and the printed command lines paste back into the same argv."""
import shlex

import pytest
import torch

from benchmarks import spec_targets


def test_every_target_run_composes(capsys):
    spec_targets.main(["--check"])
    out = capsys.readouterr().out
    assert "problem" not in out
    names = [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]
    assert names == list(spec_targets.runs(True))


def test_an_80gb_card_takes_128_rows():
    small, big = spec_targets.runs(False), spec_targets.runs(True)
    assert "pipeline.batch_sizes=[128]" in small["s3_nemotron"] and "pipeline.batch_sizes=[256]" in big["s3_nemotron"]
    assert small["headline"] == big["headline"]


def test_a_broken_run_is_named_and_exits_2(monkeypatch, capsys):
    good = spec_targets.runs(True)

    def broken(big):
        r = dict(good)
        r["headline"] = [x.replace("spec.gate=off", "spec.gate=sometimes") for x in good["headline"]]
        r["s5"] = [*good["s5"], "zzz"]
        return r
    monkeypatch.setattr(spec_targets, "runs", broken)
    with pytest.raises(SystemExit) as e:
        spec_targets.main(["--check", "--only", "headline", "s5"])
    assert e.value.code == 2
    problems = [line for line in capsys.readouterr().out.splitlines() if "problem:" in line]
    assert any("spec.gate" in p and "sometimes" in p for p in problems)
    assert any("'zzz'" in p for p in problems)


@pytest.mark.parametrize("name", list(spec_targets.runs(True)))
def test_printed_command_lines_paste_back(name):
    argv = spec_targets.runs(True)[name]
    assert shlex.split(spec_targets.shown(argv)) == argv


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without CUDA")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        spec_targets.main(["--out", str(tmp_path / "t")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "need a CUDA GPU" in err and "Traceback" not in err and not (tmp_path / "t").exists()
