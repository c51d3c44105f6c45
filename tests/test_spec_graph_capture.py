"""The greedy speculative step as one captured graph (ModelRunner.speculate): drafter forward, verify over the
window, acceptance, commit to the SSM backend and the drafter's ring, with bucket-padded batches.

CPU: captures are emulated as in tests/test_kv_graph_capture.py (FakeGraph: warm-ups, a traced forward with every
row as padding, each replay re-traced and checked to be the same ops on the same addresses, no host sync). The
outputs and ledgers must equal the unpadded step-by-step run's, and the padding rows must touch only scratch
state (the drafter's scratch ring slot included)."""
import pytest
import synodic.kernels.gdn_window as gdn_window
import synodic.kernels.mamba2_window as mamba2_window
import test_kv_graph_capture as cap
import torch

import synodic.kv.hisparse as hisparse
import synodic.kv.host_pool as host_pool
import synodic.kv.hot as hot
import synodic.kv.topk as topk
import synodic.kv.window as window
import synodic.models.attention as attention
import synodic.models.gdn as gdn
import synodic.ssm.base as ssm_base
import synodic.ssm.eager as ssm_eager
import synodic.ssm.replay as ssm_replay
from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

# tiny_mamba2 with three attention layers, random weights (as tests/spec/test_spec_engine.py)
SMALL = ["model.weights=random", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*"]
TIERED = ["kv.top_k=4", "kv.block_size=2", "kv.hot_buffer=6", "kv.host_num_blocks=256", "kv.index_num_blocks=256"]
CASES = {
    "shipped_mamba2_replay": ["model=tiny_mamba2", "ssm=replay", "spec=dflash2"],
    "shipped_gdn_eager": ["model=tiny_gdn", "ssm=eager", "spec=dflash2", "spec.num_speculative_tokens=4"],
    "shipped_gdn_ngram_staged": ["model=tiny_gdn", "ssm=replay", "spec=ngram", "spec.num_speculative_tokens=5"],
    "random_resident_eager": [*SMALL, "ssm=eager", "spec=dflash", "spec.drafter=random",
                              "spec.num_speculative_tokens=3", "kv=resident", "kv.num_blocks=128"],
    "random_adaptive_replay": [*SMALL, "ssm=replay", "ssm.ring_len=8", "spec=dspark", "spec.drafter=random",
                               "spec.num_speculative_tokens=3", "kv=adaptive", *TIERED, "kv.num_blocks=40",
                               "kv.tail_pages=3"],
    "random_load_aware_replay": [*SMALL, "ssm=replay", "ssm.ring_len=8", "spec=dspark", "spec.drafter=random",
                                 "spec.num_speculative_tokens=3", "spec.verify=load_aware"],
    "random_hisparse_replay": [*SMALL, "ssm=replay", "spec=dflash2", "spec.drafter=random",
                               "spec.num_speculative_tokens=3", "kv=hisparse", *TIERED, "kv.num_blocks=64",
                               "kv.draft_pages=3"],
}
PROMPTS = [[5, 9, 200, 31, 7, 5, 9], [100, 3], [42] * 9, [1, 2, 3, 1, 2, 3, 1, 2]]
MAX_TOKENS = [17, 9, 13, 5]  # the batch shrinks 4 → 3 (padded to 4) → 2 → 1


def serve(overrides, emulate: bool, prompts=PROMPTS):
    if any(o.startswith("spec=") for o in overrides) and "spec.verify=load_aware" not in overrides:
        overrides = [*overrides, "spec.gate=off"]  # (MeasuredGate decides from step times, which differ by run)
    eng = Engine(build_graph(compose(["runtime.device=cpu", *overrides]), max_seq_len=64))
    run = eng.runner
    gate = eng.drafter.gate if eng.drafter is not None else None
    if gate is not None:  # load-aware DSpark's gate from the shipped profile alone: step times differ between runs
        gate.cost_decay = gate.plain_decay = 0.0
        gate.probe_share = float("inf")  # (probes by doubling: a budgeted wait outlasts these short runs)
    if emulate:
        run.use_graphs = True
        run._record = lambda bucket, forward: (g := cap.FakeGraph(run, bucket, forward), g.out)
    entries, add, shapes = [], eng.ledger.add, []
    spec, spec_next = run.speculate, run.speculate_next

    def speculate(drafter, slots, *a, **k):
        shapes.append((len(slots), run._bucket(len(slots))))
        return spec(drafter, slots, *a, **k)

    def speculate_next(drafter, b, *a, **k):  # a step queued behind the one in flight (runtime.overlap)
        shapes.append((b, run._bucket(b)))
        return spec_next(drafter, b, *a, **k)
    run.speculate, run.speculate_next = speculate, speculate_next

    def ledger(batch, entry):
        entries.append(dict(entry))
        add(batch, entry)
    eng.ledger.add = ledger
    reqs = [Request(i, p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, MAX_TOKENS))]
    eng.generate(reqs)
    return dict(eng=eng, ids=[r.output_ids for r in reqs], ledger=entries, stats=eng.spec_stats.summary(),
                shapes=shapes)


def _kernels_as_launches(mp):
    """Every synodic.kernels entry the step calls is one launch on the GPU; on the CPU its reference may loop
    on the host, so the trace records it as one opaque op (as tests/test_kv_graph_capture.py does for KV)."""
    mp.setattr(hot, "kv_resolve", cap.opaque(hot.kv_resolve, "kv_resolve"))
    mp.setattr(topk, "sparse_attention", cap.opaque(topk.sparse_attention, "sparse_attention"))
    mp.setattr(host_pool, "copy_rows", cap.opaque(host_pool.copy_rows, "copy_rows"))
    for mod in (ssm_base, ssm_eager, ssm_replay, gdn, attention, mamba2_window, gdn_window, window, hisparse):
        for name, fn in list(vars(mod).items()):
            if (callable(fn) and not isinstance(fn, type) and not name.startswith("_")
                    and getattr(fn, "__module__", "").startswith("synodic.kernels")):
                mp.setattr(mod, name, cap.opaque(fn, name))


@pytest.fixture(scope="module")
def runs():
    with pytest.MonkeyPatch.context() as mp:
        _kernels_as_launches(mp)
        return {name: (serve(o, False), serve(o, True)) for name, o in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_captured_spec_step_matches_step_by_step(runs, name):
    eager, graphed = runs[name]
    assert graphed["ids"] == eager["ids"]
    assert graphed["ledger"] == eager["ledger"]
    assert graphed["stats"]["accepted_tokens"] == eager["stats"]["accepted_tokens"]
    keys, st = list(graphed["eng"].runner.graphs), graphed["stats"]
    # load-aware DSpark drafts in a graph of its own (ModelRunner.draft), then verifies in the step's
    assert any("draft" in k for k in keys) == ("load_aware" in name)
    keys = [k for k in keys if "draft" not in k]
    spec_keys = [k for k in keys if "spec" in k]
    # every step was captured: a speculative step, or the plain decode step where no row drafted (plain_steps)
    assert spec_keys and len(graphed["shapes"]) == st["steps"] - st["plain_steps"]
    assert all("spec" in k for k in keys) == (st["plain_steps"] == 0)
    assert len({k[0] for k in spec_keys}) >= 2 and 4 in {k[0] for k in spec_keys}  # several buckets
    assert any(b < bucket for b, bucket in graphed["shapes"])     # some steps ran padded rows


def test_shipped_drafters_accept_under_capture(runs):
    for name in ("shipped_mamba2_replay", "shipped_gdn_eager"):
        assert runs[name][1]["stats"]["accepted_tokens"] > 0, name


def test_plain_greedy_equals_captured_spec():
    """Losslessness through the captured path: spec output == non-speculative greedy output."""
    base = ["model=tiny_mamba2", "ssm=replay"]
    plain = serve(base, False)
    with pytest.MonkeyPatch.context() as mp:
        _kernels_as_launches(mp)
        spec = serve([*base, "spec=dflash2"], True)
    assert spec["ids"] == plain["ids"]
    # the decode rate counts tokens produced (the first came from prefill), not rows verified
    assert spec["eng"].ledger.tokens == sum(len(i) - 1 for i in spec["ids"]) == plain["eng"].ledger.tokens
    assert spec["eng"].ledger.steps < plain["eng"].ledger.steps


def test_padding_rows_touch_only_the_scratch_ring_slot():
    eng = Engine(build_graph(compose(["runtime.device=cpu", *CASES["shipped_mamba2_replay"]]), max_seq_len=64))
    run = eng.runner
    run.use_graphs = True
    run._record = lambda bucket, forward: (g := cap.FakeGraph(run, bucket, forward), g.out)
    ring = eng.drafter.model._ring
    reqs = [Request(i, p, SamplingParams(max_tokens=6)) for i, p in enumerate(PROMPTS[:3])]
    with pytest.MonkeyPatch.context() as mp:
        _kernels_as_launches(mp)
        eng.generate(reqs)
    slots = ring["pos"].shape[0] - 1                              # the scratch slot's index
    used = {r.slot for r in reqs}
    untouched = [s for s in range(slots) if s not in used]
    assert all(bool((ring["pos"][s] == -1).all()) for s in untouched)
    assert all(float(k[untouched].abs().sum()) == 0 for k in ring["k"])
    assert bool((ring["pos"][slots] >= 0).any())                  # the padding rows' writes landed in the scratch slot


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("ssm", ["eager", "replay"])
def test_real_cuda_graphs_spec_equals_plain_greedy(ssm):
    outs = {}
    for spec, graphs in (("none", False), ("dflash2", False), ("dflash2", True)):
        cfg = compose(["model=tiny_mamba2", f"ssm={ssm}", f"spec={spec}", "runtime.device=cuda",
                       f"runtime.cuda_graphs={str(graphs).lower()}"])
        eng = Engine(build_graph(cfg, max_seq_len=64))
        reqs = [Request(i, p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
        eng.generate(reqs)
        outs[spec, graphs] = [r.output_ids for r in reqs]
        if graphs:
            assert eng.runner.graphs and all("spec" in k for k in eng.runner.graphs)
    assert outs["dflash2", True] == outs["dflash2", False] == outs["none", False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv", [["kv=hisparse", *TIERED, "kv.num_blocks=64", "kv.draft_pages=5"],
                                ["kv=adaptive", *TIERED, "kv.num_blocks=40", "kv.tail_pages=5"]],
                         ids=["hisparse", "adaptive"])
def test_real_cuda_graphs_tiered_kv_spec_equals_plain_greedy(kv):
    """The verify window's host-KV path (misses staged, installed into the hot buffer) under a real capture:
    a captured step may not copy a non-pinned host tensor (a Python scalar index_put is one)."""
    outs = {}
    for spec, graphs in (("none", False), ("dflash2", False), ("dflash2", True)):
        drafter = ["spec.drafter=random"] if spec != "none" else []
        cfg = compose([*SMALL, "ssm=replay", *kv, f"spec={spec}", *drafter, "runtime.device=cuda",
                       f"runtime.cuda_graphs={str(graphs).lower()}"])
        eng = Engine(build_graph(cfg, max_seq_len=64))
        reqs = [Request(i, p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
        eng.generate(reqs)
        outs[spec, graphs] = [r.output_ids for r in reqs]
        if graphs:
            assert any("spec" in k for k in eng.runner.graphs)
    assert outs["dflash2", True] == outs["dflash2", False] == outs["none", False]


def test_steps_without_drafts_replay_the_plain_graph():
    """spec=ngram on prompts without repeats under emulated capture: the steps where no row has a match replay
    the plain decode step's graph (the keys a spec=none run captures), the rest the speculative step's; the
    outputs and ledgers equal the step-by-step run's and plain greedy decoding's."""
    prompts = [[11, 12, 13, 14, 15, 16], [300, 301, 302], [7, 8, 9, 10, 20, 21, 22, 23], [40, 41]]
    base = ["model=tiny_gdn", "ssm=replay"]
    spec = [*base, "spec=ngram", "spec.num_speculative_tokens=5"]
    with pytest.MonkeyPatch.context() as mp:
        _kernels_as_launches(mp)
        plain, eager, graphed = serve(base, True, prompts), serve(spec, False, prompts), serve(spec, True, prompts)
    assert graphed["ids"] == eager["ids"] == plain["ids"]
    assert graphed["ledger"] == eager["ledger"]
    assert graphed["stats"]["plain_steps"] == eager["stats"]["plain_steps"] > 0
    keys = set(graphed["eng"].runner.graphs)
    plain_keys = {k for k in keys if "spec" not in k}
    assert plain_keys and plain_keys <= set(plain["eng"].runner.graphs) and keys - plain_keys


@pytest.mark.parametrize("emulate", [False, True])
def test_batches_past_max_batch_step_plain_and_feed_the_ring(emulate):
    """spec.max_batch=2 while the batch shrinks 4 → 1: the 4- and 3-row steps run the plain decode step (its own
    graph, which also feeds the drafter's ring; overlapped as a plain engine's), the rest speculate; outputs equal
    plain greedy decoding's, and every committed position of every request is in its drafter ring (no gap where
    plain steps ran)."""
    base = ["model=tiny_mamba2", "ssm=replay"]
    spec = [*base, "spec=dflash2", "spec.max_batch=2"]
    with pytest.MonkeyPatch.context() as mp:
        _kernels_as_launches(mp)
        plain, got = serve(base, emulate), serve(spec, emulate)
    assert got["ids"] == plain["ids"]
    st = got["stats"]
    assert st["plain_steps"] > 0 and st["steps"] > st["plain_steps"] and st["accepted_tokens"] > 0
    assert all(b <= 2 for b, _ in got["shapes"])  # only steps of at most max_batch rows speculated
    eng = got["eng"]
    assert eng.overlapped_steps > 0  # the plain steps are queued ahead of the read-back, as without a drafter
    if emulate:
        assert any("ring" in k for k in eng.runner.graphs)
    ring = eng.drafter.model._ring["pos"]
    for slot, (p, ids) in enumerate(zip(PROMPTS, got["ids"])):  # request i was served in slot i (4 free slots)
        fed = len(p) + len(ids) - 1  # the last token is emitted, never fed (a last window may commit more)
        assert ring[slot, :fed].tolist() == list(range(fed))


def test_sampled_batches_past_max_batch_verify_no_drafts():
    """Sampling rows past spec.max_batch: one-token verifies sampled from the target alone (nothing drafted),
    every request served to its length."""
    eng = Engine(build_graph(compose(["runtime.device=cpu", "model=tiny_gdn", "spec=dflash2", "spec.max_batch=1"]),
                             max_seq_len=64))
    reqs = [Request(i, p, SamplingParams(max_tokens=6, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs)
    st = eng.spec_stats.summary()
    assert st["drafted_tokens"] == 0 and st["steps"] > 0 and all(len(r.output_ids) == 6 for r in reqs)
