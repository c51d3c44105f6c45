"""benchmarks.kv_locality: the LRU replay on hand-made selections, and the measured property on the tiny models."""
import pytest

from benchmarks.kv_locality import main, replay_buffer


def test_replay_buffer_counts_overlap_and_misses():
    # the step's newest position sits in the reserved slot: never a fetch
    assert replay_buffer([[1, 2], [2, 3], [3, 4]], capacity=2) == (0.5, 0.0)
    assert replay_buffer([[0, 1], [5, 6], [7, 8]], capacity=2) == (0.0, 0.5)
    # LRU order: 1 is touched at step 1, so 2 (older) is evicted when 4 arrives
    ov, fetch = replay_buffer([[1, 2], [1, 3], [1, 4], [2, 5]], capacity=3)
    assert fetch == pytest.approx(1 / 6)  # only position 2 (evicted at step 2) comes back from the host
    assert ov == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_trained_attention_and_distilled_indexers_have_locality_random_indexers_none(tmp_path):
    import json
    out = tmp_path / "loc.json"
    assert main(["--out", str(out), "--tokens", "256", "--steps", "16", "--top-k", "32", "--distill-steps", "80"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert all(0 <= r["overlap"] <= 1 and 0 <= r["lru_fetch"] <= 1 for r in rows)
    fetch = {}
    for r in rows:
        fetch.setdefault((r["model"], r["scorer"]), []).append(r["lru_fetch"])
    trained = [f for (m, sc), v in fetch.items() if "trained" in m and sc in ("attention", "distilled") for f in v]
    untrained = [f for (m, sc), v in fetch.items() if sc in ("learned", "fresh") for f in v]
    assert len(trained) == 6 and len(untrained) == 7  # 3 trained attention layers x 2; 4 random + 3 fresh indexers
    assert max(trained) < 0.6 < min(untrained)


def test_bad_args_name_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "x.json"), "--tokens", "256", "--top-k", "300"])
    assert e.value.code == 2 and "argument --top-k: 300: out of range" in capsys.readouterr().err


def test_saved_distilled_checkpoint_serves_with_its_indexers(tmp_path):
    """--save-distilled writes tiny_mamba2 + indexers; model.weights=DIR with kv=hisparse selects with them."""
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.graph import build_graph
    ck = tmp_path / "ck"
    assert main(["--out", str(tmp_path / "l.json"), "--tokens", "64", "--steps", "8", "--top-k", "8",
                 "--distill-steps", "2", "--save-distilled", str(ck)]) == 0
    assert (ck / "model.safetensors").is_file() and (ck / "tokenizer.json").is_file()
    cfg = compose(["model=tiny_mamba2", f"model.weights={ck}", "runtime.device=cpu", "kv=hisparse", "kv.top_k=4",
                   "kv.block_size=2", "kv.hot_buffer=6", "kv.num_blocks=64", "kv.host_num_blocks=256",
                   "kv.index_num_blocks=256"])
    g = build_graph(cfg, max_seq_len=64)
    assert g.kv.learned_index and g.model.config.index_n_heads == 4
    reqs = [Request(i, p, SamplingParams(max_tokens=8)) for i, p in enumerate([[5, 9, 200, 31, 7] * 3, [42] * 11])]
    Engine(g).generate(reqs)
    assert all(r.finish_reason == "length" and len(r.output_ids) == 8 for r in reqs)


def test_save_needs_distill_steps(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "x.json"), "--save-distilled", str(tmp_path / "ck")])
    assert e.value.code == 2 and "argument --save-distilled" in capsys.readouterr().err
