"""Top-k KV decode steps as CUDA graphs run them: bucket-padded batches, capture with every row as padding,
one graph per (bucket, view, kv.graph_key()).

CPU: the runner's capture is emulated (`FakeGraph`): two warm-ups and a traced forward with every row as
padding, then every replay re-runs the forward and checks it is the captured one (same ops on the same
shapes and Python scalars, same state tensors: the addresses of everything the forward did not allocate,
no host sync or data-dependent shape) while Python attributes the forward set on the policy are rolled back
(a real replay runs no Python). Output ids and ledgers must equal the unpadded eager run's (logits up to
the batch shape's GEMM rounding), and outputs be bitwise identical across policies. GPU: the same
workload with real graphs on and off."""
from types import SimpleNamespace

import pytest
import test_kv_policies as kvp
import torch
from test_kv_engine import PROMPTS, TIERED, TOPK
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import synodic.kv.host_pool as host_pool
import synodic.kv.hot as hot
import synodic.kv.topk as topk
from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.engine.runner import ModelRunner
from synodic.graph import build_graph
from synodic.kv.base import KVPolicy

DSA = ["model=tiny_dsa", "model.weights=random"]
POLICIES = {"resident": ["kv=resident", *TOPK, "kv.num_blocks=128"],
            "hisparse": ["kv=hisparse", *TIERED, "kv.num_blocks=64"],
            "adaptive": ["kv=adaptive", *TIERED, "kv.num_blocks=24", "kv.tail_pages=1"]}  # demotes, promotes
MAX_TOKENS = [16, 10, 14, 6]  # batches of 4, 3 (padded to 4), 2 and 1 rows

# host syncs / data-dependent output shapes (illegal or wrong inside a capture)
SYNC_OPS = {"item", "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "equal", "is_nonzero", "bincount", "histc"}
INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}


class OpTrace(TorchDispatchMode):
    """Every op of a forward: name, tensor shapes / dtypes, the address of every tensor the forward did not
    allocate itself (what a graph bakes in), and the Python scalars (baked in too). Kernels with a
    reference implementation on the CPU (`opaque`) are one entry each: on the GPU they are one launch."""
    active: "OpTrace | None" = None

    def __init__(self):
        super().__init__()
        self.ops, self.fresh, self.lifted, self.paused = [], set(), set(), 0

    def __enter__(self):
        OpTrace.active, self._tolist = self, torch.Tensor.tolist

        def tolist(t):  # reads the data without dispatching an op
            assert self.paused, "host sync in a captured step: Tensor.tolist"
            return self._tolist(t)
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        OpTrace.active, torch.Tensor.tolist = None, self._tolist
        return super().__exit__(*exc)

    def record(self, name, args, out):
        leaves = tree_leaves(args)
        ins = {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}
        sig = tuple((tuple(x.shape), x.dtype, *((x.untyped_storage().data_ptr(), x.storage_offset())
                                                 if x.untyped_storage().data_ptr() not in self.fresh else ()))
                    if isinstance(x, torch.Tensor) else x for x in leaves)
        self.ops.append((name, sig))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ins:
                self.fresh.add(t.untyped_storage().data_ptr())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            name = func.overloadpacket.__name__
            assert name not in SYNC_OPS, f"host sync in a captured step: {func}"
            assert not (name == "where" and len(args) == 1), "host sync in a captured step: where(cond)"
            assert not (name.startswith("lift_fresh") and args[0].dim()), "host data copied in a captured step"
            if name.startswith("lift_fresh"):  # a Python scalar made a tensor: on a GPU it lives on the host
                self.lifted.add(out.untyped_storage().data_ptr())
            if name in INDEX_OPS:
                idx = [t for t in tree_leaves(args[1]) if isinstance(t, torch.Tensor)]
                assert not any(t.dtype == torch.bool for t in idx), f"boolean-mask indexing in a captured step: {func}"
                val = args[2] if name != "index" and len(args) > 2 else None
                assert not (isinstance(val, torch.Tensor) and val.untyped_storage().data_ptr() in self.lifted), \
                    f"a Python scalar stored through an index in a captured step (a host-to-device copy): {func}"
            self.record(name, (args, kwargs), out)
        return out


def opaque(fn, name):
    def call(*args, **kwargs):
        tr = OpTrace.active
        if tr is None:
            return fn(*args, **kwargs)
        tr.paused += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            tr.paused -= 1
        tr.record(name, (args, kwargs), out)
        return out
    return call


class FakeGraph:
    """CPU stand-in for `ModelRunner._record` / torch.cuda.CUDAGraph (see the module docstring)."""

    def __init__(self, runner, bucket, forward):
        self.runner, self.forward = runner, forward
        for _ in range(2):
            forward()
        self.ops, self.out = self._run()

    def _run(self):
        with OpTrace() as tr:
            out = self.forward()
        return tr.ops, out

    def replay(self):
        kv = self.runner.kv
        scalars = {k: v for k, v in vars(kv).items() if isinstance(v, (bool, int, float))}
        ops, out = self._run()
        vars(kv).update(scalars)
        assert ops == self.ops, next(((j, a, b) for j, (a, b) in enumerate(zip(ops, self.ops)) if a != b),
                                     ("ops", len(ops), len(self.ops)))
        for dst, src in zip(*((self.out, out) if isinstance(out, tuple) else ((self.out,), (out,)))):
            dst.copy_(src)  # (a graph's outputs may be a tuple of buffers: ModelRunner.draft's)


def serve(policy, device="cpu", graphs=False, emulate=False):
    cfg = compose([*DSA, f"runtime.device={device}", f"runtime.cuda_graphs={str(graphs).lower()}",
                   *POLICIES[policy]])
    eng = Engine(build_graph(cfg, max_seq_len=64))
    run = eng.runner
    if emulate:
        run.use_graphs = True  # buckets pad batches; captures go through FakeGraph
        run._record = lambda bucket, forward: (g := FakeGraph(run, bucket, forward), g.out)
    logits, entries, keys = [], [], []
    decode, add = run.decode, eng.ledger.add

    def record(slots, *a, **k):
        out = decode(slots, *a, **k)
        logits.append(out.clone())
        keys.append((len(slots), run._bucket(len(slots)), *eng.graph.kv.graph_key()))
        return out

    def ledger(batch, entry):
        entries.append(dict(entry))
        add(batch, entry)
    run.decode, eng.ledger.add = record, ledger
    reqs = [Request(i, p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
    eng.generate(reqs)
    assert all(r.finish_reason == "length" for r in reqs)
    return dict(eng=eng, ids=[r.output_ids for r in reqs], logits=logits, ledger=entries, keys=keys)


@pytest.fixture(scope="module")
def runs():
    """Per policy: the unpadded eager run and the padded, emulated-capture one (kernels traced as launches)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hot, "kv_resolve", opaque(hot.kv_resolve, "kv_resolve"))
        mp.setattr(topk, "sparse_attention", opaque(topk.sparse_attention, "sparse_attention"))
        mp.setattr(host_pool, "copy_rows", opaque(host_pool.copy_rows, "copy_rows"))
        return {name: (serve(name), serve(name, emulate=True)) for name in POLICIES}


@pytest.mark.parametrize("name", list(POLICIES))
def test_padded_captured_steps_match_eager_and_keep_ledgers(runs, name):
    eager, padded = runs[name]
    assert {(b, p) for b, p, *_ in padded["keys"]} >= {(4, 4), (3, 4), (2, 2), (1, 1)}   # padding happened
    assert padded["ids"] == eager["ids"]
    # not bitwise: a GEMM over 4 rows rounds differently from one over 3 (across policies: bitwise, below)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(padded["logits"], eager["logits"]))
    assert padded["ledger"] == eager["ledger"]       # padding rows never reach a ledger
    assert padded["eng"].graph.kv.stats == eager["eng"].graph.kv.stats


def test_captured_steps_identical_across_policies(runs):
    ref = runs["resident"][1]
    for name in ("hisparse", "adaptive"):
        assert runs[name][1]["ids"] == ref["ids"], name
        assert all(torch.equal(a, b) for a, b in zip(runs[name][1]["logits"], ref["logits"])), name
    fetched = {n: sum(e["kv_host_fetched_rows"] for e in r[1]["ledger"]) for n, r in runs.items()}
    assert fetched["resident"] == 0 and fetched["hisparse"] > 0 and fetched["adaptive"] > 0
    ada = runs["adaptive"][1]
    assert ada["eng"].graph.kv.stats["demoted_pages"] > 0 and ada["eng"].graph.kv.stats["promoted_pages"] > 0
    # adaptive entered and left hot-buffer mode: its steps were replayed from graphs of both code paths
    hot_mode = [k[-1] for k in ada["keys"]]
    assert not hot_mode[0] and any(hot_mode) and not hot_mode[-1]
    assert {k[2:] for k in ada["eng"].runner.graphs} == {(False,), (True,)}
    assert all(len(k) == 2 for k in runs["resident"][1]["eng"].runner.graphs)


def test_graph_key_follows_hot_buffer_mode():
    def build(name):
        return kvp.configs()[name].build(SimpleNamespace(model=kvp.FakeModel(), device=torch.device("cpu"),
                                                         max_slots=kvp.S, max_seq_len=kvp.MAXLEN))
    assert build("resident").graph_key() == build("hisparse").graph_key() == ()   # no code-path state
    pol = build("adaptive")
    assert pol.graph_key() == (False,) and not pol.may_fetch()
    q, k, v = kvp.data(0)
    for slot in range(4):  # 22-token requests on a 40-page pool of 2-token pages: the fourth demotes
        pol.blocks.grow(slot, 22)
        for i in range(pol.NL):
            pol.prefill_attend(i, slot, 0, q[slot, :21, i], k[slot, :21, i], v[slot, :21, i])
    assert pol.hot and pol.graph_key() == (True,) and pol.may_fetch()
    pol.bind(torch.tensor([0, kvp.S]), torch.tensor([21, 0]), pol.view_blocks_for(22))
    assert pol._fetch_pending  # raised at bind: a replayed step runs no Python
    for slot in range(4):
        pol.blocks.release(slot)
    assert not pol.hot and pol.graph_key() == (False,)


def test_every_builtin_policy_is_captured_and_others_fail_with_one_line():
    from synodic.config.errors import ConfigError
    from synodic.graph import check_cuda_graphs
    for name in POLICIES:  # what build_graph decides on a GPU run with cuda_graphs=true
        g = SimpleNamespace(cuda_graphs=True, kv=build_graph(compose([*DSA, "runtime.device=cpu", *POLICIES[name]]),
                                                             max_seq_len=64).kv, notes=[])
        check_cuda_graphs(g, SimpleNamespace(kind=name), True)
        assert g.cuda_graphs and not g.notes, name
    g = SimpleNamespace(cuda_graphs=True, kv=KVPolicy(), notes=[])
    with pytest.raises(ConfigError) as e:
        check_cuda_graphs(g, SimpleNamespace(kind="custom"), True)
    assert len(e.value.lines) == 1 and "kv=custom" in e.value.lines[0]
    check_cuda_graphs(g, SimpleNamespace(kind="custom"), None)
    assert not g.cuda_graphs and g.notes == ["cuda_graphs off: kv=custom steps are not captured"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_on_and_off_give_identical_outputs():
    graphed = {}
    for name in POLICIES:
        off, on = serve(name, "cuda", graphs=False), serve(name, "cuda", graphs=True)
        assert on["eng"].runner.use_graphs and on["eng"].runner.graphs and not off["eng"].runner.graphs
        assert on["ids"] == off["ids"], name
        graphed[name] = on
    ref = graphed["resident"]
    for name in ("hisparse", "adaptive"):
        assert graphed[name]["ids"] == ref["ids"], name
        assert all(torch.equal(a, b) for a, b in zip(graphed[name]["logits"], ref["logits"])), name
        # fetches happen inside replays; the ledger still reads them (the flag is raised at bind)
        assert sum(e["kv_host_fetched_rows"] for e in graphed[name]["ledger"]) > 0, name
    assert {k[2:] for k in graphed["adaptive"]["eng"].runner.graphs} == {(False,), (True,)}


def test_runner_capture_pads_every_row_and_restores_inputs(monkeypatch):
    """_capture runs with token 0, slot -1, the scratch row and position 0 on every row, and puts the step back."""
    seen = {}
    run = ModelRunner(torch.nn.Identity(), None, None, 4, "cpu", False)
    run.inputs[:, :3] = torch.tensor([[7, 8, 9], [30, 31, 32], [0, 1, 2], [0, 1, 2]])
    before = run.inputs.clone()

    def rec(bucket, forward):
        seen["inputs"] = run.inputs[:, :bucket].clone()
        return "graph", "out"
    monkeypatch.setattr(run, "_record", rec)
    assert run._capture(3, None) == ("graph", "out")
    assert seen["inputs"].tolist() == [[0, 0, 0], [0, 0, 0], [-1, -1, -1], [4, 4, 4]]
    assert torch.equal(run.inputs, before)
