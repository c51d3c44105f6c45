"""pipeline=bench's timing loop: staggered joins and overlapped steps run the same steps as the synced loop
(the ledger, cursor mirrors included, sees identical steps) and leave the positions where they should be."""
from synodic.pipelines.bench import BenchPipeline, time_point

from synodic.config.compose import compose
from synodic.graph import build_graph


def _point(overlap: bool, stagger: int):
    cfg = compose(["model=tiny_gdn", "model.weights=random", "runtime.device=cpu", "ssm=replay",
                   "runtime.max_slots=4", f"runtime.overlap={str(overlap).lower()}"])
    p = BenchPipeline(batch_sizes=[3], prompt_len=5, steps=5, warmup=1, stagger=stagger)
    graph = build_graph(cfg, p.prompt_len + p.stagger + p.warmup + p.steps + 3, max_slots=4)
    row = time_point(graph, 3, p)
    return row, graph


def test_overlapped_and_staggered_bench_steps_match_synced():
    synced, g1 = _point(False, 3)
    overlapped, g2 = _point(True, 3)
    assert g2.overlap and not g1.overlap
    assert {k: v for k, v in synced.items() if k.startswith("bytes")} == \
        {k: v for k, v in overlapped.items() if k.startswith("bytes")}
    assert list(g1.ssm.host_wp[:3]) == list(g2.ssm.host_wp[:3])
    # rows joined after 0, 1, 2 steps: cursors spread (ring 16: 1 + 5 + 3 - s steps taken)
    assert list(g2.ssm.host_wp[:3]) == [9, 8, 7]
    assert list(g2.ssm.write_pos[:3]) == [9, 8, 7]


def test_pool_too_small_for_the_run_is_a_config_error_before_prefill():
    import pytest

    from synodic.config.errors import ConfigError
    cfg = compose(["model=tiny_gdn", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=4",
                   "kv.num_blocks=4"])
    p = BenchPipeline(batch_sizes=[3], prompt_len=5, steps=30, warmup=1, stagger=0)
    graph = build_graph(cfg, 64, max_slots=4)
    with pytest.raises(ConfigError, match="kv.num_blocks=4"):
        time_point(graph, 3, p)
    assert graph.kv.blocks.used() == 0  # nothing taken


def test_bench_reports_the_weights_footprint(tmp_path, monkeypatch):
    """model_GiB per variant: a quantized model without dense copies holds ~1/7 of the fp32 weights of the blocks;
    with them, more than the unquantized model."""
    import csv

    from synodic.pipelines.bench import run
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(tmp_path / "store"))
    quant = "quant=nvfp4 quant.method=rtn quant.artifact=none"
    cfg = compose(["pipeline=bench", "model=tiny_gdn", "model.weights=random", "runtime.device=cpu",
                   "runtime.max_slots=2", "pipeline.batch_sizes=[1]", "pipeline.prompt_len=4", "pipeline.steps=2",
                   "pipeline.warmup=1", "pipeline.stagger=0",
                   f"pipeline.variants=['', '{quant}', '{quant} quant.dense_copy=false']"])
    run(cfg, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    base, kept, lean = (float(r["model_GiB"]) for r in rows)
    assert lean < base / 2 < kept / 2 and "model_GiB" in (tmp_path / "bench.md").read_text()


def test_repeats_report_min_and_median_and_warn_when_they_disagree():
    from synodic.pipelines.bench import combine_repeats

    def rep(ms):
        return {"batch": 4, "step_ms": ms, "tokens_per_s": 4 / (ms / 1e3), "bytes_per_step": 1e6, "GB_per_s": 0.0}
    calm = combine_repeats([rep(1.00), rep(1.08), rep(1.05)])
    assert (calm["step_ms_min"], calm["step_ms"], calm["repeats"]) == (1.00, 1.05, 3) and "warning" not in calm
    assert abs(calm["tokens_per_s"] - 4 / 1.05e-3) < 1e-6 and abs(calm["GB_per_s"] - 1e6 / 1.05e-3 / 1e9) < 1e-9
    noisy = combine_repeats([rep(1.00), rep(1.30), rep(1.12)])
    assert noisy["step_ms"] == 1.12 and "12%" in noisy["warning"] and "> 10%" in noisy["warning"]


def test_repeats_that_drafted_differently_report_the_median_repeat():
    """Under spec.gate=auto repeats may draft in different steps (tokens per step differ): the row is the median
    repeat's own step time and tokens, not one repeat's tokens over another's time."""
    from synodic.pipelines.bench import combine_repeats

    def rep(ms, tokens, plain):
        return {"batch": 4, "step_ms": ms, "tokens_per_s": tokens / (ms / 1e3), "bytes_per_step": 1e6,
                "GB_per_s": 0.0, "plain_steps": plain}
    row = combine_repeats([rep(2.0, 12.0, 0), rep(1.0, 4.0, 10), rep(1.5, 8.0, 4)])
    assert row["step_ms"] == 1.5 and abs(row["tokens_per_s"] - 8.0 / 1.5e-3) < 1e-6 and row["plain_steps"] == 4
    assert row["step_ms_min"] == 1.0 and row["repeats"] == 3


def test_mixed_kv_policies_write_one_csv_with_the_union_of_columns(tmp_path):
    """'' and 'kv=adaptive' report different ledger keys; the CSV holds their union with empty cells, and the
    repeats' min / median columns."""
    import csv

    from synodic.pipelines.bench import run
    adaptive = "kv=adaptive kv.num_blocks=16 kv.host_num_blocks=16 kv.index_num_blocks=16 kv.top_k=8 kv.block_size=16"
    cfg = compose(["pipeline=bench", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=2",
                   "pipeline.batch_sizes=[2]", "pipeline.prompt_len=4", "pipeline.steps=2", "pipeline.warmup=1",
                   "pipeline.stagger=0", "pipeline.repeats=2", f"pipeline.variants=['', '{adaptive}']"])
    out = run(cfg, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert [r["variant"] for r in rows] == ["base", adaptive]
    only_adaptive = ["bytes_kv_h2d_bytes", "bytes_kv_demoted_pages"]
    assert all(rows[0][k] == "" and rows[1][k] != "" for k in only_adaptive)
    assert all(float(r["step_ms_min"]) <= float(r["step_ms"]) and r["repeats"] == "2" for r in rows)
    assert isinstance(out["warnings"], list) and out["acceptance"] == "real"
