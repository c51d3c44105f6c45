"""bench_replay's tables (CPU): every sweep key a run can record prints as its own column value, and the rows'
target marks follow the issue's bars."""
import json

from benchmarks.replay import _write


def _res():
    row = dict(op="gdn", batch=256, us=100.0, gbps=3000.0, pct_hbm=70.0)
    sweep = [dict(op="gdn", variant="replay_dual_bf16_adjoint_per_head", batch=256, us=90.0 + i, speedup=2.0, **{k: v})
             for i, (k, v) in enumerate([("config", [32, 1, "dot"]), ("flush_config", [32, 2, "bf16x3", 4]),
                                         ("ring_dots", True), ("ring_by_cursor", False), ("overlap", True),
                                         ("split", False)])]
    return dict(L=16, device="cpu", date="d", sweep=sweep,
                rows=[dict(row, variant="eager", speedup=None),
                      dict(row, variant="replay_fp32_adjoint_per_head", speedup=1.5),
                      dict(row, variant="replay_fp32_adjoint_per_head_stag", speedup=1.62),
                      dict(row, variant="replay_fp32_adjoint_per_head", batch=1, speedup=0.96)])


def test_sweep_rows_and_target_marks(tmp_path, capsys):
    res = _res()
    _write(res, tmp_path / "r.json")
    out = capsys.readouterr().out
    for cell in ("| (32, 1, 'dot') |", "| flush_config=(32, 2, 'bf16x3', 4) |", "| ring_dots=True |",
                 "| ring_by_cursor=False |", "| overlap=True |", "| split=False |"):
        assert cell in out, cell
    lines = res["table_md"].splitlines()
    assert lines[-3].endswith("| 1.50 | ≥1.6: MISSED |")
    assert lines[-2].endswith("| 1.62 | ≥1.6: met |")
    assert lines[-1].endswith("| 0.96 | ≥0.97: MISSED |")
    assert json.loads((tmp_path / "r.json").read_text())["table_md"] == res["table_md"]
