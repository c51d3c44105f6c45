"""Engine: deterministic greedy decoding, sampling reproducible per seed, the scheduler under exhausted
slots and KV pages (wait / preempt + recompute, never crash), and the results contract."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

ROOT = Path(__file__).resolve().parents[1]


def _serve(overrides, prompts, max_tokens=12, **sp):
    cfg = compose(["model.weights=random", "runtime.device=cpu", *overrides])
    graph = build_graph(cfg, max_seq_len=64)
    reqs = [Request(i, p, SamplingParams(max_tokens=max_tokens, seed=i, **sp)) for i, p in enumerate(prompts)]
    eng = Engine(graph)
    eng.generate(reqs)
    return eng, reqs


PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
def test_greedy_deterministic_and_batch_independent(preset):
    _, a = _serve([f"model={preset}"], PROMPTS)
    _, b = _serve([f"model={preset}"], PROMPTS)
    _, solo = _serve([f"model={preset}"], PROMPTS[2:3])
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert a[2].output_ids == solo[0].output_ids
    assert all(len(r.output_ids) == 12 and r.finish_reason == "length" for r in a)


def test_sampling_reproducible_per_seed():
    _, a = _serve([], PROMPTS, temperature=0.8, top_p=0.9)
    _, b = _serve([], PROMPTS, temperature=0.8, top_p=0.9)
    _, g = _serve([], PROMPTS)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.output_ids for r in a] != [r.output_ids for r in g]


def test_exhausted_slots_and_pages_wait_and_preempt_without_changing_outputs():
    _, ref = _serve([], PROMPTS)
    # 2 slots, 4-token pages, 7 pages: requests wait for slots and get preempted for pages.
    eng, tight = _serve(["runtime.max_slots=2", "kv.block_size=4", "kv.num_blocks=7"], PROMPTS)
    assert [r.output_ids for r in tight] == [r.output_ids for r in ref]
    assert sum(r.preemptions for r in tight) > 0
    assert all(r.finish_reason == "length" for r in tight)
    assert eng.scheduler.blocks.used() == 0 and len(eng.scheduler.free_slots) == 2


def test_request_larger_than_pool_is_rejected_not_crashed():
    _, reqs = _serve(["kv.block_size=4", "kv.num_blocks=3"], [[1] * 20, [2, 3]], max_tokens=5)
    assert reqs[0].finish_reason == "rejected_kv_capacity" and reqs[0].output_ids == []
    assert reqs[1].finish_reason == "length" and len(reqs[1].output_ids) == 5


def test_ledger_counts_eager_state_bytes():
    eng, reqs = _serve([], PROMPTS[:2], max_tokens=4)
    led = eng.ledger.summary()
    m = eng.graph.model.config
    per_seq = m.count("mamba2") * m.mamba_num_heads * m.mamba_head_dim * m.ssm_state_size * 4
    assert led["decode_steps"] == 3
    assert led["bytes_per_step"]["ssm_state_read"] == 2 * per_seq == led["bytes_per_step"]["ssm_state_write"]


def test_cli_decode_results_contract(tmp_path):
    p = subprocess.run([sys.executable, "run.py", "model.weights=random", "workload.max_tokens=4",
                        f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    for k in ("config", "config_hash", "choices", "env", "requests", "metrics", "ledger"):
        assert k in doc
    assert doc["choices"]["ssm"] == "eager" and doc["env"]["torch"]
    for k in ("id", "prompt_ids", "output_ids", "text"):
        assert k in doc["requests"][0]
    for k in ("decode_tokens_per_s", "ttft_ms", "tpot_ms", "wall_s"):
        assert k in doc["metrics"]
    led = doc["ledger"]
    assert led["decode_steps"] > 0
    for k in ("ssm_state_read", "ssm_state_write", "ssm_ring", "kv_device_read", "kv_host_fetch", "weights_read"):
        assert k in led["bytes_per_step"]
    assert set(led["kv"]) >= {"selected_rows", "host_fetched_rows", "host_fetch_fraction"}
    assert str(tmp_path / "results.json") in p.stdout


def _serve_reqs(overrides, params):
    cfg = compose(["model.weights=random", "runtime.device=cpu", *overrides])
    eng = Engine(build_graph(cfg, max_seq_len=64))
    reqs = [Request(i, p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, params))]
    eng.generate(reqs)
    return eng, reqs


# memory held as each step is queued: an overlapped chain releases a finished row's pages one step later
OCCUPANCY = ("kv_device_bytes", "kv_device_bytes_per_request", "kv_host_bytes")


def _traffic(summary: dict) -> dict:
    return {**summary, "bytes_per_step": {k: v for k, v in summary["bytes_per_step"].items() if k not in OCCUPANCY}}


# tiny_dsa's attention layers under the top-k policies: hot-buffer misses (hisparse) and demotions (adaptive)
TIERED = ["model=tiny_dsa", "kv.top_k=4", "kv.block_size=2", "kv.hot_buffer=6", "kv.host_num_blocks=256",
          "kv.index_num_blocks=256"]


@pytest.mark.parametrize("overrides", [["model=tiny_mamba2"], ["model=tiny_gdn", "ssm=replay"],
                                       ["runtime.max_slots=2", "kv.block_size=4", "kv.num_blocks=7"],
                                       ["kv=hisparse", *TIERED, "kv.num_blocks=64"],
                                       ["kv=adaptive", *TIERED, "kv.num_blocks=18", "kv.tail_pages=1"]])
def test_overlapped_steps_match_synced_steps(overrides):
    """Steps queued ahead of the read-back give the synced loop's tokens, finish reasons and bytes, also when a
    row stops mid-chain (its extra step's token is dropped) and under slot / page pressure."""
    plain = [SamplingParams(max_tokens=m) for m in (12, 7, 12, 3)]
    ref_eng, ref = _serve_reqs(["runtime.overlap=false", *overrides], plain)
    eng, out = _serve_reqs(["runtime.overlap=true", *overrides], plain)
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    assert eng.overlapped_steps > 0 and ref_eng.overlapped_steps == 0
    # no admission after the first: one chain through every finish (adaptive: the chain also ends where a row
    # leaves or growth would demote)
    one_chain = "runtime.max_slots=2" not in overrides and "kv=adaptive" not in overrides
    if one_chain:
        assert eng.synced_steps == 1 and ref_eng.synced_steps == ref_eng.ledger.steps
    if "kv=hisparse" in overrides:  # occupancy aside (a finished row's pages are released one step later)
        assert _traffic(eng.ledger.summary()) == _traffic(ref_eng.ledger.summary())
    else:  # every entry equal (adaptive: demotions and promotions chosen as in synced steps)
        assert eng.ledger.summary() == ref_eng.ledger.summary()
    if "kv=hisparse" in overrides or "kv=adaptive" in overrides:  # host fetches counted per step, overlapped
        assert eng.ledger.summary()["kv"]["host_fetched_rows"] > 0
    if "kv=adaptive" in overrides:
        assert eng.graph.kv.stats["demoted_pages"] > 0 and eng.graph.kv.stats["promoted_pages"] > 0
    # stop tokens seen at step 5 of request 0 and step 2 of request 2: those rows stop inside a chain
    stops = [SamplingParams(max_tokens=12, stop_token_ids=(ref[0].output_ids[5],)), plain[1],
             SamplingParams(max_tokens=12, stop_token_ids=(ref[2].output_ids[2],)), plain[3]]
    _, ref_s = _serve_reqs(["runtime.overlap=false", *overrides], stops)
    eng_s, out_s = _serve_reqs(["runtime.overlap=true", *overrides], stops)
    assert [r.output_ids for r in out_s] == [r.output_ids for r in ref_s]
    assert [r.finish_reason for r in out_s] == [r.finish_reason for r in ref_s]
    assert ref_s[0].finish_reason == "stop" and len(ref_s[0].output_ids) <= 6
    assert eng_s.ledger.tokens == sum(len(r.output_ids) - 1 for r in out_s)  # dropped tokens not counted
    if one_chain:
        assert eng_s.synced_steps == 1
    if "runtime.max_slots=2" not in overrides:
        assert eng_s.scheduler.blocks is None or eng_s.scheduler.blocks.used() == 0


def test_overlap_refused_where_the_kv_policy_plans_on_the_host():
    """Every built-in policy allows overlapped steps; one that does not (`overlap_safe` False) gets a one-line
    error for runtime.overlap=true and none for null."""
    from types import SimpleNamespace

    from synodic.graph import check_overlap
    cfg = compose(["model=tiny_dsa", "model.weights=random", "runtime.device=cpu", "kv=hisparse"])
    g = build_graph(cfg, max_seq_len=64)
    assert g.overlap is True
    g.kv = SimpleNamespace(overlap_safe=False)
    with pytest.raises(ConfigError, match="runtime.overlap=true with kv=hisparse"):
        check_overlap(g, cfg.kv, True)
    assert check_overlap(g, cfg.kv, None) is False


@pytest.mark.parametrize("overrides", [["model=tiny_gdn"], ["model=tiny_mamba2", "ssm=replay"],
                                       ["model=tiny_gdn", "kv.block_size=4", "kv.num_blocks=14"]])
def test_batched_prefill_matches_one_request_per_forward(overrides):
    # equal-length prompts share a forward (up to runtime.prefill_tokens tokens); outputs must not change,
    # including under page pressure (preempted requests re-prefill their context, again in groups)
    prompts = [[5, 9, 200, 31, 7], [100, 3, 8, 8, 1], [42] * 9, [7, 7, 7, 7, 7], [9] * 9, [1, 2]]
    solo, a = _serve([*overrides, "runtime.prefill_tokens=1"], prompts)
    grouped, b = _serve([*overrides, "runtime.prefill_tokens=12"], prompts)
    assert [r.output_ids for r in b] == [r.output_ids for r in a]
    assert [r.finish_reason for r in b] == [r.finish_reason for r in a]
    assert solo.prefill_forwards == len(prompts) + sum(r.preemptions for r in a)
    # lengths 5 (x3, 2 per forward of 12 tokens), 9 (x2, 1 per forward), 2: 2 + 2 + 1 forwards at admission
    assert grouped.prefill_forwards < solo.prefill_forwards
    if "kv.num_blocks=14" not in overrides:
        assert grouped.prefill_forwards == 5


def test_prefill_batch_rejects_unequal_lengths_and_sparse_prefill_batches():
    cfg = compose(["model=tiny_gdn", "model.weights=random", "runtime.device=cpu"])
    eng = Engine(build_graph(cfg, max_seq_len=64))
    out = eng.runner.prefill_batch([0, 1], [[1, 2], [3, 4]])
    assert out.shape[0] == 2 and out.is_inference()  # no autograd graph kept across the layers
    with pytest.raises(ValueError, match="all of one length"):
        eng.runner.prefill_batch([0, 1], [[1, 2], [3]])
    cfg = compose(["model=tiny_gdn", "model.weights=random", "runtime.device=cpu", "kv=hisparse", "kv.top_k=4"])
    eng = Engine(build_graph(cfg, max_seq_len=64))
    assert not eng.runner.batched_prefill and eng._prefill_groups([1, 2]) == [[1], [2]]
    with pytest.raises(ValueError, match="one sequence per forward"):
        eng.runner.prefill_batch([0, 1], [[1, 2], [3, 4]])
