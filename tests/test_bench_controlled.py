"""Controlled acceptance (pipeline=bench pipeline.acceptance=controlled, synodic/spec/controlled.py): the real
drafter runs, its proposals become the target's greedy continuation rejected at the requested per-position
rates. On CPU: the measured conditional acceptance per position is within 3 standard errors + 0.03 of the
requested rate, the outputs equal an independent plain greedy run (verification is real), the draws are seeded."""
import math

from synodic.pipelines.bench import BenchPipeline, bench_requests, time_point

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

RATES = [0.8, 0.5, 0.3]
BASE = ["model=tiny_gdn", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=8"]


def _run(p: BenchPipeline, spec=("spec=ngram", "spec.num_speculative_tokens=3", "spec.gate=off")):
    from synodic.pipelines.bench import row_tokens
    cfg = compose(BASE + list(spec))
    graph = build_graph(cfg, row_tokens(p, cfg.spec.window) + 1, max_slots=8)
    calls = []
    propose = graph.spec.propose

    def counted(*a, **k):  # the real drafter must still run every step (its cost is what is timed)
        calls.append(1)
        return propose(*a, **k)
    graph.spec.propose = counted
    seen = {}
    import synodic.engine.engine as engine_mod
    init = engine_mod.Engine.__init__

    def keep(self, g, *a, **k):  # the last engine built serves the timed run: its stats and requests
        init(self, g, *a, **k)
        seen["engine"] = self
    engine_mod.Engine.__init__ = keep
    try:
        row = time_point(graph, 8, p)
    finally:
        engine_mod.Engine.__init__ = init
    return row, seen["engine"], calls, graph


def test_controlled_acceptance_matches_requested_rates_and_stays_lossless():
    p = BenchPipeline(batch_sizes=[8], prompt_len=6, steps=32, warmup=1, stagger=2, repeats=1,
                      acceptance="controlled", acceptance_rates=RATES, acceptance_seed=3)
    row, eng, calls, graph = _run(p)
    assert row["acceptance"] == "controlled" and row["outputs_match_reference"] is True
    assert len(calls) == eng.spec_stats.steps > 32
    st = eng.spec_stats
    reach = [st.pos_drafted[0], *st.pos_accepted[:2]]
    for k, (want, got, n) in enumerate(zip(RATES, row["acceptance_by_position"], reach)):
        assert n >= 30, (k, n)
        tol = 3 * math.sqrt(want * (1 - want) / n) + 0.03
        assert abs(got - want) <= tol, (k, got, want, n, tol)
    assert eng.drafter.unknown_drafts() == 0 == row["uncontrolled_drafts"]
    # outputs equal an independent plain greedy run of the same requests on a graph without speculation
    plain = build_graph(compose(BASE), graph.max_seq_len, max_slots=8)
    reqs, _ = bench_requests(graph, 8, p)
    served = {r.id: r for r in eng.scheduler.finished}
    ref = [Request(r.id, r.prompt_ids, SamplingParams(max_tokens=len(served[r.id].output_ids))) for r in reqs]
    Engine(plain).generate(ref)
    assert all(r.output_ids == served[r.id].output_ids for r in ref)


def test_controlled_draws_are_seeded():
    p = BenchPipeline(batch_sizes=[8], prompt_len=6, steps=6, warmup=1, stagger=0, repeats=1,
                      acceptance="controlled", acceptance_rates=RATES, acceptance_seed=1)
    a, ea, _, _ = _run(p)
    b, eb, _, _ = _run(p)
    c, ec, _, _ = _run(p.model_copy(update={"acceptance_seed": 2}))
    assert (ea.spec_stats.pos_accepted, ea.spec_stats.steps) == (eb.spec_stats.pos_accepted, eb.spec_stats.steps)
    assert a["tokens_per_row_step"] == b["tokens_per_row_step"]
    assert ec.spec_stats.pos_accepted != ea.spec_stats.pos_accepted


def test_controlled_needs_rates_for_the_scheme():
    import pytest

    from synodic.config.errors import ConfigError
    p = BenchPipeline(batch_sizes=[2], prompt_len=4, steps=2, warmup=1, stagger=0, repeats=1,
                      acceptance="controlled", measured_rates={"dflash2": [0.2] * 7})
    with pytest.raises(ConfigError, match="pipeline.measured_rates has"):
        _run(p)
    with pytest.raises(ConfigError, match="2 rates for spec.num_speculative_tokens=4"):
        _run(p.model_copy(update={"acceptance_rates": [0.5] * 2}),
             ("spec=ngram", "spec.num_speculative_tokens=4", "spec.gate=off"))


def test_the_shipped_default_rates_cover_the_shipped_drafters():
    """conf/pipeline/bench.yaml's measured_rates: one conditional rate per trained draft position (γ = 7)."""
    cfg = compose(["pipeline=bench"])
    assert cfg.pipeline.acceptance == "real"  # never the default
    assert len(cfg.pipeline.measured_rates["dflash2"]) == compose(["spec=dflash2"]).spec.num_speculative_tokens


def test_the_captured_step_path_draws_the_same_acceptances_as_the_host_path(monkeypatch):
    """A device drafter (dflash2) runs the engine's ModelRunner.speculate with the wrapper's draft_device inside;
    its host drafts staged into the same step, and the op-by-op path (propose on the host), give the same
    per-position acceptances and outputs."""
    from synodic.engine.engine import Engine
    from synodic.engine.runner import ModelRunner
    from synodic.spec.controlled import ControlledDrafter
    p = BenchPipeline(batch_sizes=[8], prompt_len=6, steps=12, warmup=1, stagger=2, repeats=1,
                      acceptance="controlled", acceptance_rates=RATES, acceptance_seed=5)
    spec = ("spec=dflash2", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.gate=off")
    used = []
    speculate = ModelRunner.speculate
    monkeypatch.setattr(ModelRunner, "speculate", lambda self, *a, **k: used.append(1) or speculate(self, *a, **k))
    dev_row, dev_eng, _, _ = _run(p, spec)
    assert used and dev_row["outputs_match_reference"] and dev_row["uncontrolled_drafts"] == 0
    assert dev_eng.spec_stats.pos_accepted[0] > 0
    used.clear()
    monkeypatch.setattr(ControlledDrafter, "graph_safe", property(lambda self: False))
    staged_row, staged_eng, _, _ = _run(p, spec)  # host drafts staged into the same captured step
    assert used and staged_row["outputs_match_reference"]
    used.clear()
    monkeypatch.setattr(Engine, "_spec_fixed", lambda self, batch: None)
    host_row, host_eng, _, _ = _run(p, spec)      # op by op
    assert not used and host_row["outputs_match_reference"]
    for eng in (staged_eng, host_eng):
        assert dev_eng.spec_stats.pos_accepted == eng.spec_stats.pos_accepted
        assert {r.id: r.output_ids for r in dev_eng.scheduler.finished} == \
            {r.id: r.output_ids for r in eng.scheduler.finished}


def _run_with(p: BenchPipeline, spec, reference):
    """_run with an explicit reference continuation (time_point's `reference`)."""
    import synodic.pipelines.bench as bench_mod
    real = bench_mod.reference_outputs
    bench_mod.reference_outputs = lambda graph, b, p: reference(real(graph, b, p))
    try:
        return _run(p, spec)
    finally:
        bench_mod.reference_outputs = real


def _shifted(ref: dict[int, list[int]]) -> dict[int, list[int]]:
    """A continuation the target does not produce after its first token (the prefill's, which no verify decides):
    every later token + 1, a stale reference as after a near-tie flip."""
    return {i: toks[:1] + [t + 1 for t in toks[1:]] for i, toks in ref.items()}


def test_forced_acceptance_keeps_the_rates_when_the_target_disagrees_with_the_reference(monkeypatch):
    """acceptance=forced: with a reference the target never agrees with, controlled acceptance collapses to 0 at
    draft 1 while forced still keeps drafts at the requested rates, emits the reference exactly, and draws the
    same acceptances on the captured device path, the staged path and op by op."""
    from synodic.engine.engine import Engine
    from synodic.engine.runner import ModelRunner
    from synodic.spec.controlled import ControlledDrafter
    spec = ("spec=dflash2", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.gate=off")
    p = BenchPipeline(batch_sizes=[8], prompt_len=6, steps=32, warmup=1, stagger=2, repeats=1,
                      acceptance="controlled", acceptance_rates=RATES, acceptance_seed=5)
    ctl, _, _, _ = _run_with(p, spec, _shifted)
    assert ctl["acceptance_by_position"][0] == 0.0 and not ctl["outputs_match_reference"]
    forced = p.model_copy(update={"acceptance": "forced"})
    used = []
    speculate = ModelRunner.speculate
    monkeypatch.setattr(ModelRunner, "speculate", lambda self, *a, **k: used.append(1) or speculate(self, *a, **k))
    row, eng, _, _ = _run_with(forced, spec, _shifted)
    assert used and row["acceptance"] == "forced" and row["outputs_match_reference"] is True
    st = eng.spec_stats
    reach = [st.pos_drafted[0], *st.pos_accepted[:2]]
    for k, (want, got, n) in enumerate(zip(RATES, row["acceptance_by_position"], reach)):
        assert n >= 30, (k, n)
        assert abs(got - want) <= 3 * math.sqrt(want * (1 - want) / n) + 0.03, (k, got, want, n)
    runs = [eng]
    monkeypatch.setattr(ControlledDrafter, "graph_safe", property(lambda self: False))
    runs.append(_run_with(forced, spec, _shifted)[1])  # host drafts staged into the captured step
    monkeypatch.setattr(Engine, "_spec_fixed", lambda self, batch: None)
    used.clear()
    runs.append(_run_with(forced, spec, _shifted)[1])  # op by op
    assert not used
    for other in runs[1:]:
        assert other.spec_stats.pos_accepted == eng.spec_stats.pos_accepted
        assert {r.id: r.output_ids for r in other.scheduler.finished} == \
            {r.id: r.output_ids for r in eng.scheduler.finished}


def test_forced_equals_controlled_where_the_target_follows_the_reference():
    """With the real reference (fp32 CPU: the verify agrees with the plain run), forcing changes nothing."""
    spec = ("spec=dflash2", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.gate=off")
    p = BenchPipeline(batch_sizes=[8], prompt_len=6, steps=12, warmup=1, stagger=2, repeats=1,
                      acceptance="controlled", acceptance_rates=RATES, acceptance_seed=2)
    a, ea, _, _ = _run(p, spec)
    b, eb, _, _ = _run(p.model_copy(update={"acceptance": "forced"}), spec)
    assert a["outputs_match_reference"] and b["outputs_match_reference"]
    assert ea.spec_stats.pos_accepted == eb.spec_stats.pos_accepted
    assert {r.id: r.output_ids for r in ea.scheduler.finished} == {r.id: r.output_ids for r in eb.scheduler.finished}
