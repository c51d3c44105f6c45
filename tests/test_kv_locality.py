"""synodic.kv.locality: the LRU replay on hand-made selections, and the measured property on the tiny models."""
import pytest

from synodic.kv.locality import main, replay_buffer


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


def test_bad_args_name_the_key(tmp_path):
    with pytest.raises(SystemExit, match="--top-k=300"):
        main(["--out", str(tmp_path / "x.json"), "--tokens", "256", "--top-k", "300"])
