"""benchmarks.window_flush on the CPU: every fold's flush matches the serial fold at small shapes."""
import json


def test_window_flush_tiny(tmp_path):
    from benchmarks.window_flush import main
    out = tmp_path / "wf.json"
    main(["--tiny", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["fold"] for r in rows] == ["serial", "dot", "tf32x3"]
    assert all(r["ok"] for r in rows)
