"""Progress off a terminal goes to logging (so run.log shows how far a job got), and quant_grid.png has a
title and a linear axis from zero."""
import logging

import pytest

from synodic.results import progress as prog


def test_progress_logs_when_not_a_terminal(monkeypatch, caplog):
    monkeypatch.setattr(prog, "on_terminal", lambda: False)
    clock = iter(range(0, 1000, 4))  # each perf_counter call: 4 s later
    monkeypatch.setattr(prog.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="synodic.progress"):
        with prog.progress("eval", 5, "batches", every_s=10) as advance:
            for _ in range(5):
                advance()
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0] == "eval: started, 5 batches"
    assert msgs[-1].startswith("eval: 5/5 (100%) batches") and msgs[-1].endswith("(done)")
    assert 1 <= len(msgs) - 2 < 5  # throttled: some intermediate lines, not one per call
    assert any("left" in m for m in msgs[1:-1])


def test_progress_disabled_is_silent(caplog):
    with caplog.at_level(logging.INFO, logger="synodic.progress"):
        with prog.progress("x", 3, enabled=False) as advance:
            advance()
    assert not caplog.records


def test_quant_grid_plot_is_linear_from_zero_with_a_title(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from synodic.evaluation import quant_grid
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    rows = [{"scheme": "mxfp4:rtn", "mode": "weight-only", "kl_mean": 0.0400},
            {"scheme": "mxfp4:dualquant", "mode": "weight-only", "kl_mean": 0.0390}]
    quant_grid._plot_kl(rows, tmp_path / "g.png", "t")
    (ax,) = figs[0].axes
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and ax.get_title() == "t"
    h = [b.get_height() for b in ax.patches]
    assert h == pytest.approx([0.04, 0.039])  # a 2.5 % difference is drawn as 2.5 %
    assert (tmp_path / "g.png").is_file()


def test_cpu_eval_default_scores_a_slice_and_says_so(tmp_path, monkeypatch, capsys):
    from synodic.pipelines import eval as ev

    from synodic.config.compose import compose
    from synodic.data.corpus import load_heldout
    monkeypatch.setattr(ev, "CPU_EVAL_TOKENS", 96)
    f = tmp_path / "t.txt"
    f.write_text(load_heldout()[:4000])
    cfg = compose(["pipeline=eval", "runtime.device=cpu", f"pipeline.text={f}", "pipeline.seq_len=32"])
    out = ev.run(cfg, tmp_path)
    assert out["metrics"]["tokens"] == 96 and out["max_tokens_used"] == 96
    assert "pipeline.max_tokens=null on the CPU: scoring the first 96 of" in capsys.readouterr().err
    cfg = compose(["pipeline=eval", "runtime.device=cpu", f"pipeline.text={f}", "pipeline.seq_len=32",
                   "pipeline.max_tokens=100000"])
    assert ev.run(cfg, tmp_path)["metrics"]["tokens"] > 96  # asked for: all of it
