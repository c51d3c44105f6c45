"""DSpark load-aware verification lengths: the vectorised admission equals the plain greedy loop, verifies
everything when the forward's cost is flat, and nothing past the point where tokens cost more than they
return; the SPS profile round-trips through its file; DraftGate drafts only where its predicted rate beats plain
steps, and otherwise probes at doubling intervals."""
import json

import numpy as np
import pytest

from synodic.spec.load_aware import DraftGate, SpsProfile, choose_lengths, choose_lengths_reference


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


def _gated(plain: float, draft: float) -> SpsProfile:
    """Verify 100 steps/s up to 16 tokens, 50 at 64; plain and draft steps at fixed rates for batches 1-8."""
    return SpsProfile([1, 16, 64], [100.0, 100.0, 50.0], "m", "cpu", [1, 8], [plain, plain], [draft, draft])


def test_gated_profile_round_trip_and_old_profiles(tmp_path):
    p = _gated(300.0, 200.0)
    p.save(tmp_path / "sps.json")
    q = SpsProfile.load(tmp_path / "sps.json")
    assert q == p and q.gates and q.plain(4) == 300.0 and q.draft(4) == 200.0
    old = SpsProfile([1, 8], [900.0, 880.0])
    old.save(tmp_path / "old.json")
    assert not SpsProfile.load(tmp_path / "old.json").gates and "batches" not in json.loads(
        (tmp_path / "old.json").read_text())
    bad = json.loads((tmp_path / "sps.json").read_text())
    bad["batches"] = [8, 1]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="ascending 'batches'"):
        SpsProfile.load(tmp_path / "bad.json")


def test_gate_rates_are_tokens_over_draft_plus_verify_time():
    g = DraftGate(_gated(300.0, 200.0))
    g.observe(4, kept=3.0, verified=5.0)  # 4 rows x 5 tokens = 20 verified: SPS(20) = 100 - 50 * 4 / 48
    spec, plain = g.rates(4)
    assert spec == pytest.approx(4 * 3.0 / (1 / 200.0 + 1 / (100.0 - 50.0 * 4 / 48)))
    assert plain == pytest.approx(4 * 300.0)


def test_gate_stays_open_where_drafts_pay():
    g = DraftGate(_gated(plain=100.0, draft=400.0))  # 3 tokens a row per 12.5 ms against 1 per 10 ms
    assert g.drafts(2)  # nothing measured: draft
    for _ in range(5):
        g.observe(2, kept=3.0, verified=4.0)
        assert g.open(2) and g.drafts(2) and g.wait == 1
    assert g.probes == 0


def test_gate_closes_and_probes_at_doubling_intervals():
    # 20 ms for 2 tokens a row against 5 ms for 1; no probe budget (probe_share inf): the doubling alone
    g = DraftGate(_gated(plain=200.0, draft=100.0), max_wait=8, probe_share=float("inf"))
    g.observe(2, kept=2.0, verified=4.0)
    assert not g.open(2)
    waits = []
    for _ in range(6):
        n = 0
        while not g.drafts(2):
            g.plain_step(2)
            n += 1
        waits.append(n)
        g.observe(2, kept=2.0, verified=4.0)  # the probe finds the same acceptance
    assert waits == [2, 4, 8, 8, 8, 8] and g.probes == 6 and g.plain_steps == sum(waits)
    g.observe(2, kept=8.0, verified=8.0)  # the text turns repetitive: the average moves halfway, the gate opens
    assert g.kept == pytest.approx(5.0) and g.open(2) and g.wait == 4  # (a winning step halves the wait)


def test_gate_prices_the_measured_step_times():
    """Measured step times scale the profile's: a drafting step timed at 5x its profile closes a gate the profile
    alone would keep open, and plain steps timed at 3x theirs open it again."""
    g = DraftGate(_gated(plain=100.0, draft=400.0))
    g.observe(2, kept=3.0, verified=4.0, seconds=5 * (1 / 400.0 + 1 / 100.0))
    assert g.spec_cost == 1.0 and g.open(2)  # a bucket's first timed step may be one-off work: not priced
    g.observe(2, kept=3.0, verified=4.0, seconds=5 * (1 / 400.0 + 1 / 100.0))
    assert g.spec_cost == pytest.approx(3.0) and not g.open(2)  # (half-way from 1 to 5): 3 tokens / 37.5 ms < 1 / 10
    g.observe(3, kept=3.0, verified=4.0, seconds=100.0)  # another bucket's first: not priced either
    assert g.spec_cost == pytest.approx(3.0)

    for _ in range(40):
        g.plain_step(2, seconds=3 / 100.0)
    assert g.plain_cost == pytest.approx(3.0, rel=0.05) and g.open(2)


def test_a_losing_probe_waits_for_its_budget():
    """A drafting step that costs 4 plain steps and keeps 2 tokens a row wastes 2 plain steps: at 2 % of plain
    throughput the next probe waits 100 steps, not 2 (capped at max_wait)."""
    g = DraftGate(_gated(plain=200.0, draft=100.0), max_wait=256)
    g.observe(2, kept=2.0, verified=4.0)
    assert g._probe_excess(2) == pytest.approx(2.0) and g.wait == 100
    g = DraftGate(_gated(plain=200.0, draft=100.0), max_wait=64)
    g.observe(2, kept=2.0, verified=4.0)
    assert g.wait == 64
