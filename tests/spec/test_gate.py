"""spec.gate=auto (synodic/spec/gate.py): greedy batches draft only where drafting steps beat plain steps. The
MeasuredGate's schedule (a drafting step first, then plain steps until one is timed, then the faster side, with
probes at doubling waits), and through the Engine for every scheme, synced and overlapped: a closed gate runs
plain steps and probes, an open one drafts every step, and the output is plain greedy decoding's either way."""
import pytest

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph
from synodic.spec.gate import MeasuredGate, bucket

MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*", "ssm=replay", "ssm.ring_len=8"]
SCHEMES = {"ngram": ["spec=ngram", "spec.num_speculative_tokens=3"],
           "dflash2": ["spec=dflash2", "spec.drafter=random", "spec.num_speculative_tokens=3"],
           "dspark": ["spec=dspark", "spec.drafter=random", "spec.num_speculative_tokens=3"]}
PROMPTS = [[5, 9, 200, 31, 7, 5, 9], [100, 3], [42] * 9, [1, 2, 3, 1, 2, 3, 1, 2]]


class FixedGate(MeasuredGate):
    """A MeasuredGate whose rates are set, not measured (a shared CPU's step times would decide at random)."""

    def __init__(self, spec: float, plain: float):
        super().__init__()
        self.rate = (spec, plain)
        self.fed_steps = 0

    def open(self, b):
        return self.rate[0] > self.rate[1]

    def plain_step(self, b, seconds=None, fed=False):
        self.fed_steps += fed
        super().plain_step(b, None, fed)

    def observe(self, b, kept, verified, seconds=None):
        super().observe(b, kept, verified, None)


def _serve(overrides, gate=None, max_tokens=12):
    eng = Engine(build_graph(compose(overrides), max_seq_len=64))
    if gate is not None:
        eng.drafter.gate = gate
    reqs = [Request(i, p, SamplingParams(max_tokens=max_tokens)) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs)
    return [r.output_ids for r in reqs], eng


def test_measured_gate_schedule():
    g = MeasuredGate(max_wait=8)
    assert g.drafts(3)                        # nothing measured: draft
    g.observe(3, 2.0, 4.0, None)              # a capture: not timed, still unknown
    assert g.drafts(3)
    g.observe(3, 2.0, 4.0, 0.01)              # 600 tokens/s drafting at bucket 4
    assert not g.drafts(3) and not g.drafts(4)  # the plain side next, even though a probe would be due
    g.plain_step(4, None)
    assert not g.drafts(4)
    g.plain_step(4, 0.002)                    # 2000 tokens/s plain: plain wins
    assert not g.open(4) and g.drafts(4)      # since (2) >= wait (2): a probe
    g.observe(4, 2.0, 4.0, 0.01)              # still losing: a probe costs 5 plain steps for 1.5 steps' tokens,
    assert g.probes == 1 and g.wait == 8      # so 2 % of plain throughput needs 175 steps between probes (cap 8)
    assert g.drafts(5)                        # bucket 8 has no rates yet: measured on its own
    waits = []
    for _ in range(4):
        while not g.drafts(4):
            g.plain_step(4, 0.002)
        g.observe(4, 2.0, 4.0, 0.01)
        waits.append(g.wait)
    assert waits == [8, 8, 8, 8]              # capped at max_wait
    g.observe(4, 40.0, 41.0, 0.01)            # acceptance jumped: 16000 tokens/s moves the average past plain
    assert g.open(4) and g.wait == 4          # a winning step halves the wait
    assert bucket(1) == 1 and bucket(3) == 4 and bucket(4) == 4 and bucket(5) == 8
    g.plain_step(4, 0.003, fed=True)         # a step that fed the drafter: still a plain step of the rate,
    s = g.summary()                           # but timed apart from the others in the summary
    assert s["tokens_per_s"]["4"]["plain"] == pytest.approx(4 / (0.002 + 0.2 * 0.001))
    # six probes (the last one won), each timed at 10 ms, against 2 ms plain steps: what a probe costs
    assert s["probes"] == 6 and s["probe_ms"] == pytest.approx(10.0) and s["plain_ms"] == pytest.approx(2.0)
    assert s["feed_steps_timed"] == 1 and s["feed_ms"] == pytest.approx(3.0)


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("overlap", ["true", "false"])
def test_closed_gate_runs_plain_steps_and_stays_lossless(scheme, overlap):
    over = [*MODEL, f"runtime.overlap={overlap}"]
    plain, _ = _serve(over)
    g = FixedGate(spec=1.0, plain=10.0)
    out, eng = _serve([*over, *SCHEMES[scheme]], g)
    assert out == plain
    s = eng.spec_stats.summary()
    assert g.plain_steps > 0 and g.probes >= 1
    assert s["steps"] - s["plain_steps"] == g.probes  # closed from the start: every drafting step is a probe
    assert eng.drafter.summary()["gate"]["plain_steps"] == g.plain_steps
    # the plain steps before a probe feed a neural drafter's context (ngram reads no target features)
    assert (g.fed_steps > 0) == (scheme != "ngram") and g.fed_steps <= g.plain_steps


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_open_gate_drafts_every_step(scheme):
    plain, _ = _serve(MODEL)
    g = FixedGate(spec=10.0, plain=1.0)
    out, eng = _serve([*MODEL, *SCHEMES[scheme]], g)
    assert out == plain and g.plain_steps == 0 and g.probes == 0


def test_measured_gate_on_real_step_times():
    """The default gate, timing this machine's steps: whatever it decides, the output is plain greedy's, and it
    holds both rates of the buckets it ran."""
    plain, _ = _serve(MODEL, max_tokens=24)
    out, eng = _serve([*MODEL, *SCHEMES["dflash2"]], max_tokens=24)
    g = eng.drafter.gate
    assert out == plain and isinstance(g, MeasuredGate)
    rates = g.summary()["tokens_per_s"]
    assert rates and any(r["drafting"] and r["plain"] for r in rates.values())


def test_gate_off_and_sampled_rows_always_draft():
    _, eng = _serve([*MODEL, *SCHEMES["dflash2"], "spec.gate=off"])
    assert eng.drafter.gate is None
    eng = Engine(build_graph(compose([*MODEL, *SCHEMES["ngram"]]), max_seq_len=64))
    g = eng.drafter.gate = FixedGate(spec=1.0, plain=10.0)
    reqs = [Request(i, p, SamplingParams(max_tokens=8, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs)
    assert g.plain_steps == 0 and eng.spec_stats.summary()["plain_steps"] < eng.spec_stats.summary()["steps"]


def test_controlled_drafter_shares_its_drafters_gate():
    from synodic.spec.controlled import ControlledDrafter
    eng = Engine(build_graph(compose([*MODEL, *SCHEMES["dflash2"]]), max_seq_len=64))
    c = ControlledDrafter(eng.drafter, 3, [0.5] * 3, {0: [1, 2, 3]}, 512)
    assert c.gate is eng.drafter.gate and c.gate is not None


def test_a_first_drafting_step_with_one_off_costs_does_not_shut_the_bucket():
    """The first drafting step of a bucket may carry kernel compiles: it only doubles the wait, and the second
    drafting step replaces it in the rate, so a drafter that pays is drafting again after one short wait."""
    from synodic.spec.gate import MeasuredGate
    g = MeasuredGate()
    g.observe(1, kept=3.0, verified=8.0, seconds=0.5)    # 500 ms: compiles in the first drafting step
    g.plain_step(1, seconds=0.003)
    assert not g.open(1) and g.wait == 2                 # losing, but not yet priced: the wait only doubles
    while not g.drafts(1):
        g.plain_step(1, seconds=0.003)
    g.observe(1, kept=3.0, verified=8.0, seconds=0.0075)  # 400 tok/s against plain 333
    assert g.open(1) and g.spec[1] == 3.0 / 0.0075
