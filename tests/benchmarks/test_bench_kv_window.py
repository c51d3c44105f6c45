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


def test_greedy_drafts_on_trained_text_are_all_accepted(tmp_path):
    """--drafts greedy: the drafts are the target's own continuation under the benchmark's KV policy, so every
    verify step accepts all of them (steps x T tokens in `steps` windows) and the window's queries are real text."""
    res = main(["--model", "tiny_mamba2", "--weights", "auto", "--device", "cpu", "--prompts", "heldout",
                "--drafts", "greedy", "--prompt-len", "48", "--requests", "2", "--steps", "3", "--top-k", "8",
                "--hot-buffer", "16", "--block-size", "4", "--out", str(tmp_path / "g.json")])
    assert res["outputs_identical"] and res["prompts"] == "heldout" and res["drafts"] == "greedy"
    for row in (res["shared"], res["per_query"]):
        assert row["verify_steps"] == 3 and row["stats"]["window_per_query_rows"] > 0
