"""benchmarks/spec_decode.py on the CPU: every variant lossless against plain decoding, the JSON a person reads."""
import json

from benchmarks import spec_decode


def test_smoke_run_writes_rates_and_lossless_rows(tmp_path):
    out = tmp_path / "s.json"
    # (the gate off: on a CPU it may keep every step plain, and this checks the drafting steps' rows)
    spec_decode.main(["--smoke", "--specs", "none", "dflash2 spec.gate=off", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["spec"] for r in rows] == ["none", "dflash2 spec.gate=off"]
    assert all(r["greedy_equals_none"] and r["decode_tokens_per_s"] > 0 for r in rows)
    assert rows[0]["speedup_vs_none"] == 1.0 and rows[1]["mean_acceptance_length"] >= 1.0
    assert rows[1]["decode_tokens"] == rows[0]["decode_tokens"]  # the same tokens, fewer steps


def test_repeated_rounds_report_the_median_of_interleaved_rounds(tmp_path):
    out = tmp_path / "s.json"
    spec_decode.main(["--smoke", "--specs", "none", "ngram", "--repeats", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    for r in rows:
        assert r["rounds"] == 3 and len(r["rates"]) == 3
        assert abs(r["decode_tokens_per_s"] - sorted(r["rates"])[1]) <= 0.1
        by_round = [v / b for v, b in zip(r["rates"], rows[0]["rates"])]
        assert r["speedup_by_round"] == [round(x, 3) for x in by_round]
        assert r["speedup_paired"] == sorted(by_round)[1]
    assert rows[1]["greedy_equals_none"]
