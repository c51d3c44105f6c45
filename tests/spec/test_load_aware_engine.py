"""spec=dspark spec.verify=load_aware through the Engine: greedy output still equals plain greedy decoding, each
step's per-row draft counts are exactly choose_lengths of the drafter's calibrated confidences under the SPS
profile, a gated profile sends batches where drafts cannot pay to plain steps (still lossless, drafting only to
probe), and a missing profile is one line naming the command that writes it."""
import numpy as np
import pytest

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph
from synodic.spec.load_aware import SpsProfile, choose_lengths

MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*", "ssm=replay", "ssm.ring_len=8"]
LOAD_AWARE = ["spec=dspark", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.verify=load_aware"]
PROMPTS = [[5, 9, 200, 31, 7, 5, 9], [100, 3], [42] * 9, [1, 2, 3, 1, 2, 3, 1, 2]]


def _run(overrides, sps=None, timed=False, lazy=True, max_wait=None):
    eng = Engine(build_graph(compose(overrides), max_seq_len=64))
    eng.lazy_ring = lazy
    seen = []
    if sps is not None:
        d = eng.drafter
        d.sps = sps
        if d.gate is not None:
            d.gate.probe_share = float("inf")  # (the doubling alone: these runs are too short for a budgeted wait)
        if d.gate is not None and max_wait is not None:
            d.gate.max_wait = max_wait
        if d.gate is not None and not timed:  # decisions from the profile alone (a shared CPU's step times vary)
            d.gate.cost_decay = d.gate.plain_decay = 0.0
        inner = d.lengths

        def lengths(confidence):
            n = inner(confidence)
            seen.append((confidence.float().numpy().copy(), n))
            return n
        d.lengths = lengths
    reqs = [Request(i, p, SamplingParams(max_tokens=10)) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs)
    return [r.output_ids for r in reqs], seen, eng


def test_load_aware_is_lossless_and_follows_choose_lengths():
    plain, _, _ = _run(MODEL)
    # verify cost flat up to 6 tokens, then steeper: some rows verify drafts, others none
    sps = SpsProfile([1, 6, 12, 40], [100.0, 100.0, 70.0, 20.0])
    out, seen, _ = _run([*MODEL, *LOAD_AWARE, "spec.gate=off"], sps)  # (every step drafts)
    assert out == plain
    assert seen and all(n == choose_lengths(c, sps)[0].tolist() for c, n in seen)
    assert len({x for _, n in seen for x in n}) > 1  # the lengths actually vary


def test_missing_profile_is_one_line(tmp_path, monkeypatch):
    import synodic.spec.load_aware as la
    monkeypatch.setattr(la, "SPS_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"python -m benchmarks.sps_profile model=tiny_mamba2") as e:
        Engine(build_graph(compose([*MODEL, *LOAD_AWARE]), max_seq_len=64))
    assert "\n" not in str(e.value).strip()


def test_shipped_profiles_load():
    """Every shipped profile (CPU, and the GPUs it was measured on) loads and sits where find_profile looks for
    its model and device name."""
    import synodic.spec.load_aware as la
    for m in ("tiny_mamba2", "tiny_gdn"):
        p = la.find_profile(m, "cpu")
        assert p.tokens == sorted(p.tokens) and np.all(np.asarray(p.steps_per_s) > 0)
    files = sorted(la.SPS_DIR.glob("*.json"))
    assert any("nvidia" in f.name for f in files)
    for f in files:
        p = SpsProfile.load(f)
        assert la.profile_file(p.model, p.device) == f and p.tokens == sorted(p.tokens), f


def test_load_aware_windows_are_cut_to_the_chosen_drafts(monkeypatch):
    """Load-aware verify spends only the window its lengths chose (1 + the longest row's), never the fixed 1 + γ
    window: that would verify the drafts it decided not to pay for. Its greedy steps run as the captured step of
    that width (ModelRunner.speculate with the drafts staged), and a step where no row drafts as the plain step."""
    from synodic.engine.runner import ModelRunner
    widths, speculate, decode = [], ModelRunner.speculate, ModelRunner.decode
    monkeypatch.setattr(ModelRunner, "verify", lambda self, *a, **k: pytest.fail("greedy load-aware went op by op"))

    def spec(self, drafter, slots, positions, anchors, gamma, *a, **k):
        widths.append(1 + gamma)
        return speculate(self, drafter, slots, positions, anchors, gamma, *a, **k)

    def dec(self, *a, **k):
        widths.append(1)
        return decode(self, *a, **k)
    monkeypatch.setattr(ModelRunner, "speculate", spec)
    monkeypatch.setattr(ModelRunner, "decode", dec)
    sps = SpsProfile([1, 6, 12, 40], [100.0, 100.0, 70.0, 20.0])
    _, seen, _ = _run([*MODEL, *LOAD_AWARE, "spec.gate=off"], sps)
    assert widths == [1 + max(n) for _, n in seen] and min(widths) < 4


def _gated(plain: float) -> SpsProfile:
    """Verify and draft steps at 100/s at any size; plain steps at `plain`/s."""
    return SpsProfile([1, 64], [100.0, 100.0], "m", "cpu", [1, 64], [plain, plain], [100.0, 100.0])


def test_gate_sends_a_losing_batch_to_plain_steps_and_probes():
    """Plain steps 10x as fast as a draft or a verify: no acceptance pays for drafting (≤ 4 tokens a row per
    20 ms against 1 per ms), so after the first step the engine drafts only to probe, at doubling intervals."""
    plain, _, _ = _run(MODEL)
    out, seen, eng = _run([*MODEL, *LOAD_AWARE], _gated(1000.0))
    g = eng.drafter.gate
    assert out == plain
    assert g.plain_steps >= 5 and g.probes >= 1 and len(seen) == 1 + g.probes
    assert eng.drafter.summary()["gate"]["plain_steps"] == g.plain_steps


def test_gate_drafts_every_step_where_drafts_pay():
    plain, _, _ = _run(MODEL)
    out, seen, eng = _run([*MODEL, *LOAD_AWARE], _gated(1.0))
    assert out == plain and eng.drafter.gate.plain_steps == 0 and eng.drafter.gate.probes == 0 and seen


def test_gate_times_the_engine_steps():
    """Both kinds of step reach the gate's cost averages: drafting steps from before their drafts to their
    read-back, plain steps by their period."""
    plain, _, _ = _run(MODEL)
    out, _, eng = _run([*MODEL, *LOAD_AWARE], _gated(1000.0), timed=True)
    g = eng.drafter.gate
    assert out == plain and g.plain_steps and g.spec_cost != 1.0 and g.plain_cost != 1.0


def test_a_closed_gates_deferred_ring_drafts_as_the_eager_ring():
    """While the gate is closed, plain steps buffer their fused features (LazyRing) and the next drafting step
    flushes them: every drafting step then sees the context an eagerly fed ring holds (same confidences, same
    lengths, same output)."""
    out_e, seen_e, _ = _run([*MODEL, *LOAD_AWARE], _gated(1000.0), lazy=False)
    out_l, seen_l, eng = _run([*MODEL, *LOAD_AWARE], _gated(1000.0), lazy=True)
    assert eng.drafter.deferred is not None  # (the run ends on buffered plain steps: nothing drafts after them)
    assert out_l == out_e and len(seen_l) == len(seen_e) >= 2
    for (ce, ne), (cl, nl) in zip(seen_e, seen_l):
        assert nl == ne and np.allclose(cl, ce, atol=1e-5)


def test_lazy_ring_flush_equals_eager_appends():
    """LazyRing against the ring fed directly, one position at a time, over a wrap of its buffer and a slot whose
    ring already holds a newer position than one buffered."""
    import torch
    eng = Engine(build_graph(compose([*MODEL, *LOAD_AWARE[:3], "spec.context_window=8"]), max_seq_len=64))
    d = eng.drafter
    m = d.model
    from synodic.spec.runtime import LazyRing
    lazy = LazyRing(m, eng.graph.max_slots, 5, m._ring["kv"].dtype, d.device)
    g = torch.Generator().manual_seed(0)
    H = eng.runner.model.config.hidden_size * len(d.hidden_layers)
    slots = torch.tensor([0, 2])
    m.reset(slots)
    saved = {k: m._ring[k].clone() for k in ("kv", "pos")}
    steps = [(torch.randn(2, 1, H, generator=g), torch.tensor([p, p + 3])) for p in range(9)]
    for h, pos in steps:  # eager
        m.append_context(slots, h, pos[:, None], torch.ones(2, 1, dtype=torch.bool))
    eager = {k: m._ring[k].clone() for k in ("kv", "pos")}
    m._ring["kv"].copy_(saved["kv"])
    m._ring["pos"].copy_(saved["pos"])
    for h, pos in steps[:4]:  # positions 0-3 straight into the ring, 4-8 buffered (5 rows: no wrap loss)
        m.append_context(slots, h, pos[:, None], torch.ones(2, 1, dtype=torch.bool))
    for h, pos in steps[4:]:
        lazy.commit_device(slots, h, pos, torch.ones(2, dtype=torch.long))
    lazy.flush(slots)
    assert torch.equal(m._ring["pos"], eager["pos"])
    assert torch.allclose(m._ring["kv"], eager["kv"], atol=1e-6)
    assert (lazy.pos[slots] == -1).all()


@pytest.mark.parametrize("text", ['{"tokens": [8], "steps_per_s": [1.0], "batches": [1], "plain_steps_per_s": [null],'
                                  ' "draft_steps_per_s": [1.0]}', '{"tokens": [8]}', "[1, 2", '{"tokens": 5}'])
def test_a_broken_profile_is_one_line(tmp_path, monkeypatch, text):
    import synodic.spec.load_aware as la
    monkeypatch.setattr(la, "SPS_DIR", tmp_path)
    (tmp_path / "tiny_mamba2-cpu.json").write_text(text)
    with pytest.raises(ConfigError, match="is not an SPS profile") as e:
        Engine(build_graph(compose([*MODEL, *LOAD_AWARE]), max_seq_len=64))
    assert "\n" not in str(e.value).strip()


def test_closed_gate_under_preemption():
    """A KV pool too small for every request: the scheduler preempts and recomputes while the gate is closed and
    the deferred ring holds buffered positions; a re-admitted request's prefill clears its slot's buffer, and the
    output is still plain greedy decoding's, with the drafts an eagerly fed ring gives."""
    kv = ["kv=resident", "kv.block_size=2", "kv.num_blocks=14"]
    plain, _, _ = _run([*MODEL, *kv])
    out_e, seen_e, _ = _run([*MODEL, *kv, *LOAD_AWARE], _gated(1000.0), lazy=False)
    out_l, seen_l, eng = _run([*MODEL, *kv, *LOAD_AWARE], _gated(1000.0))
    assert out_l == out_e == plain
    assert eng.drafter.gate.plain_steps > 0 and eng.scheduler.blocks.used() == 0
    assert sum(r.preemptions for r in eng.scheduler.finished) > 0
    assert len(seen_l) == len(seen_e)
    for (ce, ne), (cl, nl) in zip(seen_e, seen_l):
        assert nl == ne and np.allclose(cl, ce, atol=1e-5)


def test_deferred_ring_sized_for_the_longest_plain_stretch():
    """With max_wait = 2 the buffer holds 3 positions: the plain loop checks the gate before reading the step in
    flight back, so 3 plain steps can run between drafting steps, and a buffer of 2 would lose one (the drafts
    would then differ from an eagerly fed ring's)."""
    out_e, seen_e, _ = _run([*MODEL, *LOAD_AWARE], _gated(1000.0), lazy=False, max_wait=2)
    out_l, seen_l, eng = _run([*MODEL, *LOAD_AWARE], _gated(1000.0), max_wait=2)
    assert eng.drafter.deferred.rows == 3 and eng.drafter.gate.wait == 2
    assert out_l == out_e and len(seen_l) == len(seen_e) >= 3
    for (ce, ne), (cl, nl) in zip(seen_e, seen_l):
        assert nl == ne and np.allclose(cl, ce, atol=1e-5)


def test_closed_gate_feeds_only_the_steps_before_a_probe(monkeypatch):
    """spec.gate_feed=2: of each stretch of plain steps only the last two hand the drafter their features (the
    others are exact plain steps); the output is still plain greedy decoding's and probes still draft."""
    from synodic.spec.runtime import LazyRing
    fed, commit = [], LazyRing.commit_device

    def count(self, slots, hidden, start, accepted):
        fed.append(start.tolist())
        return commit(self, slots, hidden, start, accepted)
    monkeypatch.setattr(LazyRing, "commit_device", count)
    plain, _, _ = _run(MODEL)
    out, seen, eng = _run([*MODEL, *LOAD_AWARE, "spec.gate_feed=2"], _gated(1000.0))
    g = eng.drafter.gate
    assert out == plain and g.feed == 2 and g.probes >= 1 and len(seen) == 1 + g.probes
    assert 0 < len(fed) < g.plain_steps, (len(fed), g.plain_steps)
    fed.clear()
    _, _, eng = _run([*MODEL, *LOAD_AWARE, "spec.gate_feed=257"], _gated(1000.0))
    assert len(fed) == eng.drafter.gate.plain_steps  # every plain step feeds: the eager ring's context


def test_gate_feeds_the_last_steps_of_a_stretch():
    from synodic.spec.load_aware import DraftGate
    g = DraftGate(_gated(1000.0), feed=3)
    g.wait = 8
    fed = []
    for _ in range(8):
        fed.append(g.feeds())
        g.plain_step(1)
    assert fed == [False] * 5 + [True] * 3
