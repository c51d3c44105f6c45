"""benchmarks.kv_window on the CPU at toy sizes: both modes run, emit the same tokens, and the JSON's shared
fetch bytes never exceed the per-query ones (counted beside them in both runs)."""
import json

from benchmarks.kv_window import main


def test_smoke_writes_one_json(tmp_path):
    out = tmp_path / "w.json"
    res = main(["--smoke", "--out", str(out), "--prompt-len", "40", "--steps", "4", "--requests", "2"])
    assert json.loads(out.read_text())["benchmark"] == "kv_window"
    assert res["outputs_identical"]
    on, off = res["shared"], res["per_query"]
    assert on["per_query_fetch_bytes_per_step"] == off["per_query_fetch_bytes_per_step"] == \
        off["window_fetch_bytes_per_step"] > 0
    assert on["window_fetch_bytes_per_step"] <= off["window_fetch_bytes_per_step"]
