"""The decode benchmarks' cheap long contexts (benchmarks/context_fill.py): a request seeded by replaying another
request's recorded prefill decodes exactly as one prefilled for real (greedy, tiny_dsa on the CPU), whether the
record was made under the same KV policy or another one, with a drafter seeded from the recorded hidden states;
and host pools built on a reused (dirty) buffer decode as fresh ones."""
import pytest
import torch

from benchmarks.context_fill import ContextFill
from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph
from synodic.kv.rebuild import rebuild_kv

BASE = ["model=tiny_dsa", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=4", "kv.block_size=16",
        "kv.top_k=16", "kv.num_blocks=64", "kv.host_num_blocks=64", "kv.index_num_blocks=64"]
PROMPT_LEN, OUT = 90, 10  # past top_k and B = 32: the sparse prefill selects and the hot buffer is preloaded


def _prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 4096, (PROMPT_LEN,), generator=g).tolist() for _ in range(2)]


def _serve(graph, prompts, fill=None, max_tokens=OUT):
    eng = Engine(graph)
    if fill is not None:
        fill.install(eng)
    reqs = [Request(i, list(p), SamplingParams(max_tokens=max_tokens)) for i, p in enumerate(prompts)]
    eng.generate(reqs)
    return [r.output_ids for r in reqs], eng


@pytest.fixture(scope="module")
def graphs():
    return {kind: build_graph(compose([*BASE, f"kv={kind}", *extra]), PROMPT_LEN + OUT + 8)
            for kind, extra in (("adaptive", ["kv.num_blocks=22"]), ("hisparse", []))}


@pytest.mark.parametrize("kind", ["adaptive", "hisparse"])
def test_replayed_contexts_decode_as_real_prefills(graphs, kind):
    """Four requests over two prompts: with the fill, two are prefilled and two replayed (adaptive's small pool
    demotes, so replayed requests also take the hot-buffer preload path); outputs and host fetches equal a run
    that prefills all four for real."""
    graph = graphs[kind]
    a, b = _prompts()
    prompts = [a, b, a, b]
    real, eng_real = _serve(graph, prompts)
    fill = ContextFill()
    seeded, eng_fill = _serve(graph, prompts, fill)
    assert not any(r.preemptions for r in eng_fill.scheduler.finished)  # (a recompute would be a real prefill)
    assert fill.stats["real"] == 2 and fill.stats["replayed"] == 2
    assert seeded == real
    assert real[0] == real[2] and real[1] == real[3] and real[0] != real[1]
    assert eng_fill.ledger.totals["kv_host_fetched_rows"] == eng_real.ledger.totals["kv_host_fetched_rows"] > 0
    if kind == "adaptive":
        assert eng_fill.ledger.totals.get("kv_demoted_pages", 0) > 0
    # a second engine on the same policy: every request replayed, still the same tokens
    again, _ = _serve(graph, prompts, fill)
    assert again == real and fill.stats["real"] == 2 and fill.stats["replayed"] == 6


def test_record_from_another_policy_seeds_this_one(graphs):
    """Records carry the model's prefill outputs only: made under hisparse, replayed under adaptive rebuilt on the
    same model (as the benchmark rebuilds policies)."""
    graph, prompts = graphs["adaptive"], _prompts()
    adaptive, fill = graph.cfg.kv, ContextFill()
    rebuild_kv(graph, graphs["hisparse"].cfg.kv)
    try:
        _serve(graph, prompts, fill)
    finally:
        rebuild_kv(graph, adaptive)
    real, _ = _serve(graph, prompts)
    seeded, _ = _serve(graph, prompts, fill)
    assert fill.stats["real"] == 2 and fill.stats["replayed"] == 2 and seeded == real


def test_replayed_context_seeds_the_drafter():
    """spec=dflash2 (random drafter, real acceptance): the drafter's ring is seeded from the recorded hidden states,
    so drafts, acceptance and outputs equal real prefills'; a record made without speculation (graph.spec off)
    still carries the drafter's hidden layers."""
    cfg = compose([*BASE, "kv=adaptive", "spec=dflash2", "spec.drafter=random", "spec.num_speculative_tokens=3",
                   "spec.gate=off"])
    graph = build_graph(cfg, PROMPT_LEN + 4 * OUT + 8)
    a, b = _prompts()
    prompts = [a, b, a, b]
    real, eng_real = _serve(graph, prompts)
    fill = ContextFill(graph.spec.hidden_layers)
    spec, graph.spec = graph.spec, None
    try:
        _serve(graph, prompts[:2], fill, max_tokens=2)  # records, plain
    finally:
        graph.spec = spec
    seeded, eng_fill = _serve(graph, prompts, fill)
    assert fill.stats["real"] == 2 and fill.stats["replayed"] == 4
    assert seeded == real
    assert eng_fill.spec_stats.pos_accepted == eng_real.spec_stats.pos_accepted
    assert eng_fill.spec_stats.steps == eng_real.spec_stats.steps


def test_host_pool_on_a_reused_dirty_buffer_decodes_as_a_fresh_pool(graphs):
    """hisparse reads its host pool every step (misses, window-free): stale bytes (NaNs among them) never reach
    attention."""
    graph = graphs["hisparse"]
    prompts = _prompts() * 2
    cfg = graph.cfg.kv
    fresh, eng = _serve(graph, prompts)
    assert eng.ledger.totals["kv_host_fetched_rows"] > 0
    buf = torch.randint(0, 255, ((cfg.host_num_blocks + 1) * cfg.block_size * 4 * 576 * 4 + 100,),
                        dtype=torch.uint8)  # stale bytes of an earlier pool (tiny_dsa rows: 576 fp32 values)
    pol = rebuild_kv(graph, cfg, host_buffer=buf)
    assert pol.host.data.data_ptr() == buf.data_ptr()
    reused, _ = _serve(graph, prompts)
    rebuild_kv(graph, cfg)
    assert reused == fresh
    with pytest.raises(ValueError, match="at least"):
        rebuild_kv(graph, cfg, host_buffer=buf[:1000])
    rebuild_kv(graph, cfg)


def test_models_with_ssm_layers_are_refused():
    graph = build_graph(compose(["model=tiny_mamba2", "model.weights=random", "runtime.device=cpu",
                                 "runtime.max_slots=2", "kv=adaptive", "kv.block_size=16", "kv.top_k=16"]), 64)
    with pytest.raises(ValueError, match="SSM layers"):
        ContextFill().install(Engine(graph))
