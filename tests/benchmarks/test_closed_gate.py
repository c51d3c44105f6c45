"""benchmarks.closed_gate on the CPU: every variant runs and reports its rate against plain and its host time."""
import json


def test_closed_gate_smoke(tmp_path, monkeypatch):
    import benchmarks.closed_gate as cg
    from synodic.engine.engine import Engine
    for name in cg.HOST:  # (main wraps them for the process; restore after)
        monkeypatch.setattr(Engine, name, getattr(Engine, name))
    out = tmp_path / "cg.json"
    cg.main(["--models", "tiny_mamba2", "--batches", "2", "--schemes", "dflash2", "--repeats", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["none", "dflash2 gate shut", "dflash2 spec.gate=off"]
    assert all(r["decode_tokens_per_s"] > 0 for r in rows) and rows[0]["vs_plain"] == 1.0
    assert "_finish" in rows[1]["host_ms_per_step"]
    assert rows[1]["drafting_steps"] == 0 < rows[2]["drafting_steps"]  # shut: no step drafted, not even a probe
