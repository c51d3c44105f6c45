"""DSpark load-aware verification lengths: the vectorised admission equals the plain greedy loop, verifies
everything when the forward's cost is flat, and nothing past the point where tokens cost more than they
return; the SPS profile round-trips through its file."""
import numpy as np

from synodic.spec.load_aware import SpsProfile, choose_lengths, choose_lengths_reference


def test_matches_reference_on_random_cases():
    rng = np.random.default_rng(0)
    for _ in range(40):
        B, G = rng.integers(1, 9), rng.integers(1, 8)
        conf = rng.uniform(0.05, 0.99, (B, G))
        knee = int(rng.integers(2, 40))
        prof = SpsProfile([1, knee, 4 * knee], [100.0, 100.0, 100.0 / 3])  # flat, then memory-bound no more
        got, thr = choose_lengths(conf, prof)
        ref, rthr = choose_lengths_reference(conf.tolist(), prof)
        assert got.tolist() == ref and abs(thr - rthr) < 1e-9


def test_flat_cost_verifies_all_and_steep_cost_verifies_none():
    conf = np.full((4, 5), 0.8)
    flat = SpsProfile([1, 1000], [50.0, 50.0])
    assert choose_lengths(conf, flat)[0].tolist() == [5] * 4
    steep = SpsProfile([1, 4, 5, 100], [50.0, 50.0, 20.0, 1.0])  # one token past the batch's anchors halves SPS
    assert choose_lengths(conf, steep)[0].tolist() == [0] * 4


def test_profile_file_round_trip(tmp_path):
    p = SpsProfile([1, 8, 64], [900.0, 880.0, 400.0], "tiny_mamba2", "cpu")
    p.save(tmp_path / "sps.json")
    q = SpsProfile.load(tmp_path / "sps.json")
    assert q == p and abs(q(36) - 640.0) < 1e-9
