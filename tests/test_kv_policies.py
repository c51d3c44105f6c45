"""KV residency policies driven directly, step by step, with a scripted schedule (admissions, growth,
finishes, slot reuse) on tiny shapes that force hot-buffer misses, LRU evictions and wrap-around,
demotions (device- and host-sourced installs) and promotions.

Exactness: every prefill and decode output of kv=hisparse and kv=adaptive is bitwise identical to
kv=resident with the same top-k; resident top-k itself matches a float64 re-derivation."""
import math
from types import SimpleNamespace

import pytest
import torch

from synodic.kv.config import AdaptiveKV, HiSparseKV, ResidentKV
from synodic.kv.indexer import KeyIndexer

NL, NQ, NKV, HD = 3, 4, 2, 8
S, MAXLEN = 5, 64


class FakeModel:
    def __init__(self, dtype=torch.float32):
        self.attention_layers = [SimpleNamespace(nq=NQ, nkv=NKV, hd=HD) for _ in range(NL)]
        self._p = torch.zeros(1, dtype=dtype)

    def parameters(self):
        yield self._p


# (request id, prompt length, admit at step, finish after step); slots are reused as requests finish
SCHEDULE = [(0, 3, 0, 30), (1, 14, 0, 12), (2, 9, 2, 36), (3, 21, 4, 36), (4, 5, 13, 36), (5, 17, 14, 36)]
STEPS = 36


def data(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    n = len(SCHEDULE)
    q = torch.randn(n, MAXLEN, NL, NQ, HD, generator=g)
    k = torch.randn(n, MAXLEN, NL, NKV, HD, generator=g)
    v = torch.randn(n, MAXLEN, NL, NKV, HD, generator=g)
    # make some keys stand out so selections repeat (hits) and move (misses)
    k[:, ::5] *= 3.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


def drive(cfg, tensors, pad_rows=1, dtype=torch.float32, steps=STEPS):
    """Runs SCHEDULE through a policy; returns its outputs in order, and the policy."""
    pol = cfg.build(SimpleNamespace(model=FakeModel(dtype), device=torch.device("cpu"), max_slots=S,
                                    max_seq_len=MAXLEN))
    q, k, v = tensors
    free = list(range(S - 1, -1, -1))
    running = {}  # rid → [slot, length]
    outs = []
    for step in range(steps):
        for rid, T, at, _ in SCHEDULE:
            if at == step:
                slot = free.pop()
                assert pol.blocks.can_grow(slot, T + 1), (cfg.kind, step, rid)
                pol.blocks.grow(slot, T + 1)
                for i in range(NL):
                    outs.append(pol.prefill_attend(i, slot, 0, q[rid, :T, i], k[rid, :T, i], v[rid, :T, i]))
                running[rid] = [slot, T + 1]
        for rid, st in running.items():
            assert pol.blocks.can_grow(st[0], st[1]), (cfg.kind, step, rid)
            pol.blocks.grow(st[0], st[1])
        assert pol.blocks.used() <= pol.blocks.num_blocks
        ids = sorted(running, key=lambda r: -running[r][0])
        rows = torch.tensor([running[r][0] for r in ids] + [S] * pad_rows)
        pos = torch.tensor([running[r][1] - 1 for r in ids] + [0] * pad_rows)
        P = pos[: len(ids)]
        pol.bind(rows, pos, pol.view_blocks_for(max(running[r][1] for r in ids)))
        for i in range(NL):
            qs = torch.cat([q[ids, P, i], q[:1, 0, i].expand(pad_rows, -1, -1)])
            ks = torch.cat([k[ids, P, i], k[:1, 0, i].expand(pad_rows, -1, -1)])
            vs = torch.cat([v[ids, P, i], v[:1, 0, i].expand(pad_rows, -1, -1)])
            outs.append(pol.attend(i, qs, ks, vs)[: len(ids)])
        pol.bytes_for([running[r][1] for r in ids])
        for rid, _, _, fin in SCHEDULE:
            if rid in running and fin == step:
                pol.blocks.release(running[rid][0])
                free.append(running.pop(rid)[0])
        for st in running.values():
            st[1] += 1
    for st in running.values():
        pol.blocks.release(st[0])
    assert pol.blocks.used() == 0
    return outs, pol


TINY = dict(top_k=4, block_size=2)
TIERED = dict(TINY, hot_buffer=6, host_num_blocks=200, index_num_blocks=200)


def configs(indexer="bf16"):
    return {
        "resident": ResidentKV(num_blocks=200, indexer=indexer, **TINY),
        "hisparse": HiSparseKV(num_blocks=60, indexer=indexer, **TIERED),
        # tight: 4-5 long requests do not fit resident → demotions; finishes free pages → promotions
        "adaptive": AdaptiveKV(num_blocks=40, tail_pages=1, promote_free_fraction=0.1, promote_pages_per_step=3,
                               indexer=indexer, **TIERED),
    }


@pytest.mark.parametrize("indexer", ["bf16", "fp8"])
def test_policies_bitwise_identical(indexer):
    tensors = data(1)
    runs = {name: drive(cfg, tensors) for name, cfg in configs(indexer).items()}
    ref, _ = runs["resident"]
    for name in ("hisparse", "adaptive"):
        outs, _ = runs[name]
        assert len(outs) == len(ref)
        for j, (a, b) in enumerate(zip(outs, ref)):
            assert torch.equal(a, b), (name, j)
    his, ada = runs["hisparse"][1], runs["adaptive"][1]
    # the shapes forced the paths under test
    assert his.stats["fetched_rows"] > 3 * NL * his.B            # misses beyond a buffer's worth: LRU wrap-around
    assert all(f > 0 for f in his.stats_layers["fetched"])
    st = ada.stats
    assert st["demoted_pages"] > 0 and st["promoted_pages"] > 0
    assert st["install_rows_device"] > 0 and st["install_rows_host"] > 0
    assert 0 < st["fetched_rows"] < his.stats["fetched_rows"]


def test_resident_topk_matches_float64_rederivation():
    tensors = data(2)
    q, k, v = tensors
    outs, pol = drive(configs()["resident"], tensors, pad_rows=0)
    idx = KeyIndexer(1, 1, 2, NKV, HD, "bf16", "cpu")
    # replay the schedule's decode steps for request 3 (admitted at step 4 with 21 prompt tokens)
    rid, T, at = 3, 21, 4
    j = 0
    for step in range(STEPS):
        j += NL * sum(a == step for _, _, a, _ in SCHEDULE)
        running = [r for r, _, a, f in SCHEDULE if a <= step <= f]
        order = sorted(running, key=lambda r: -slot_of_run(r))
        if step >= at:
            P = T + step - at
            n = order.index(rid)
            for i in range(NL):
                kd = idx.dequantize(*idx.quantize(k[rid, : P + 1, i]))
                qs = q[rid, P, i].view(NKV, NQ // NKV, HD).sum(1)
                score = (qs[None] * kd).sum(-1).sum(-1)
                sel = KeyIndexer.select(score[None], torch.tensor([P]), 4)[0].long()
                qq = q[rid, P, i].double().view(NKV, NQ // NKV, HD)
                s = torch.einsum("grd,tgd->grt", qq, k[rid, sel, i].double()) / math.sqrt(HD)
                want = torch.einsum("grt,tgd->grd", s.softmax(-1), v[rid, sel, i].double()).reshape(NQ, HD)
                got = outs[j + i][n]
                assert torch.allclose(got.double(), want, atol=1e-5), (step, i)
        j += NL


@pytest.mark.parametrize("nkv", [1, 2])
@pytest.mark.parametrize("kind", ["resident", "hisparse", "adaptive"])
def test_prefill_matches_float64_sparse_reference(monkeypatch, kind, nkv):
    """Prefill (masked dense attention, chunked over queries) = per query, a float64 softmax over exactly
    the positions the indexer selects (every position up to the query's own while it is < top_k)."""
    from synodic.kv.topk import TopKPolicy
    T, K = 37, 6
    model = FakeModel()
    for m in model.attention_layers:
        m.nkv = nkv
    monkeypatch.setattr(TopKPolicy, "PREFILL_SCORE_BYTES", 4 * NQ * T * 5)     # 5 queries per chunk
    small = dict(top_k=K, block_size=4)
    cfg = {"resident": ResidentKV(num_blocks=32, **small),
           "hisparse": HiSparseKV(num_blocks=32, hot_buffer=12, host_num_blocks=32, index_num_blocks=32, **small),
           "adaptive": AdaptiveKV(num_blocks=32, hot_buffer=12, host_num_blocks=32, index_num_blocks=32,
                                  **small)}[kind]
    pol = cfg.build(SimpleNamespace(model=model, device=torch.device("cpu"), max_slots=2, max_seq_len=64))
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(T, NQ, HD, generator=g), torch.randn(T, nkv, HD, generator=g), torch.randn(T, nkv, HD,
                                                                                                    generator=g)
    k[::5] *= 3.0
    pol.blocks.grow(0, T + 1)
    got = pol.prefill_attend(0, 0, 0, q, k, v)
    sel = pol.indexer.prefill_select(q, k, K)                                  # every query's selection
    for p in range(T):
        keys = sel[p][sel[p] >= 0].long()
        if p < K:
            assert sorted(keys.tolist()) == list(range(p + 1)), p
        qq = q[p].double().view(nkv, NQ // nkv, HD)
        s = torch.einsum("grd,tgd->grt", qq, k[keys].double()) / math.sqrt(HD)
        want = torch.einsum("grt,tgd->grd", s.softmax(-1), v[keys].double()).reshape(NQ, HD)
        assert torch.allclose(got[p].double(), want, atol=1e-5), p


def slot_of_run(rid):
    """Slots the scripted scheduler hands out (free list popped from slot 0 up, reused as requests finish)."""
    free = list(range(S - 1, -1, -1))
    held = {}
    for step in range(STEPS):
        for r, _, a, _ in SCHEDULE:
            if a == step:
                held[r] = free.pop()
        if rid in held:
            return held[rid]
        for r, _, _, f in SCHEDULE:
            if r in held and f == step:
                free.append(held.pop(r))
    raise KeyError(rid)


def test_short_sequences_take_the_fast_path():
    """Requests shorter than B never miss under hisparse, and hold only ceil(len / bs) device pages."""
    cfg = HiSparseKV(num_blocks=160, top_k=4, block_size=2, hot_buffer=60, host_num_blocks=200, index_num_blocks=200)
    _, pol = drive(cfg, data(3))
    assert pol.stats["fetched_rows"] == 0
    assert pol.blocks.blocks_for(7) == 4 and pol.blocks.blocks_for(61) == 31
    assert pol.blocks.blocks_for(1000) == pol.blocks.num_blocks + 1   # more than the host/index pools hold


def test_ledger_keys_and_footprints():
    tensors = data(4)
    pols = {name: drive(cfg, tensors)[1] for name, cfg in configs().items()}
    for name, pol in pols.items():
        led = pol.bytes_for([5, 9])
        for key in ("kv_device_read", "kv_host_fetch", "kv_selected_rows", "kv_host_fetched_rows", "kv_h2d_bytes",
                    "kv_d2h_bytes", "kv_device_bytes", "kv_device_bytes_per_request", "kv_running",
                    "kv_index_read", "kv_miss_rate_layer0", "kv_fetched_rows_layer2"):
            assert key in led, (name, key)
        assert led["kv_selected_rows"] == NL * (4 + 4)
    # footprint per request at length 40: resident pages vs hot buffer vs adaptive minimum
    assert pols["resident"].blocks.blocks_for(40) == 20
    assert pols["hisparse"].blocks.blocks_for(40) == 4          # ceil((B + 1) / bs)
    assert pols["adaptive"].blocks.blocks_for(40) == 1 + 3      # tail page + hot buffer (no newest slot)


def test_dsa_preset_has_mla_rows_and_stays_exact():
    """tiny_dsa (576-value rows, every layer attention) through the model: identical logits per policy."""
    from synodic.models.lm import DecodeContext, HybridLM, PrefillContext
    from synodic.models.presets_dsa import DSA_PRESETS
    cfg = DSA_PRESETS["tiny_dsa"]
    assert 2 * cfg.num_key_value_heads * cfg.head_dim == 576
    model = HybridLM(cfg).init_weights(0).eval()
    small = dict(top_k=8, block_size=4, hot_buffer=12, host_num_blocks=64, index_num_blocks=64)
    logits = {}
    for kv in (ResidentKV(top_k=8, block_size=4, num_blocks=64), HiSparseKV(num_blocks=64, **small),
               AdaptiveKV(num_blocks=12, tail_pages=1, **small)):
        pol = kv.build(SimpleNamespace(model=model, device=torch.device("cpu"), max_slots=2, max_seq_len=64))
        toks, L, seq = [3, 1, 4, 1, 5, 9, 2, 6] * 4, 32, []
        with torch.inference_mode():
            pol.blocks.grow(0, L + 1)
            t = int(model(torch.tensor([toks]), PrefillContext(ssm=None, kv=pol, slots=[0]))[0, -1].argmax())
            for _ in range(12):
                assert pol.blocks.can_grow(0, L + 1)
                pol.blocks.grow(0, L + 1)
                pol.bind(torch.tensor([0]), torch.tensor([L]), pol.view_blocks_for(L + 1))
                out = model(torch.tensor([[t]]), DecodeContext(ssm=None, kv=pol, positions=torch.tensor([L])))
                seq.append(out)
                t, L = int(out[0, -1].argmax()), L + 1
        logits[kv.kind] = seq
    for kind in ("hisparse", "adaptive"):
        assert all(torch.equal(a, b) for a, b in zip(logits[kind], logits["resident"])), kind


def test_fetch_measurement_runs():
    from benchmarks.kv_measure import run
    kw = dict(requests=3, prompt_len=96, steps=6, top_k=8, block_size=8)
    his = run("hisparse", 12, **kw)
    ada = run("adaptive", 12, **kw)
    assert his["finished"] == ada["finished"] == 3 and his["host_fetched_rows"] > 0
    assert ada["fetch_fraction"] < his["fetch_fraction"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="drives CPU tensors through the Triton interpreter; on a GPU "
                    "the real-CUDA capture tests (tests/test_spec_graph_capture.py) run the Triton path")
def test_policies_bitwise_identical_on_the_triton_path(monkeypatch):
    """The GPU code path (Triton resolve, sparse attention and row copies; here under the interpreter)
    keeps the same guarantee: same kernel, same rows in the same order → identical bits."""
    import functools

    from synodic.kernels.kv_resolve import kv_resolve
    from synodic.kernels.sparse_attention import sparse_attention

    import synodic.kv.hot as hot
    import synodic.kv.topk as topk
    monkeypatch.setattr(hot, "kv_resolve", functools.partial(kv_resolve, backend="triton"))

    def attn(q, *a, **kw):  # decode batches on the kernel; long prompt prefills stay on the reference (speed)
        return sparse_attention(q, *a, backend="triton" if q.shape[0] <= 8 else "ref", **kw)
    monkeypatch.setattr(topk, "sparse_attention", attn)
    tensors = data(5)
    cfgs = configs()
    cfgs["adaptive"] = AdaptiveKV(num_blocks=24, tail_pages=1, **TIERED)
    runs = {name: drive(cfg, tensors, steps=6) for name, cfg in cfgs.items()}
    ref, _ = runs["resident"]
    for name in ("hisparse", "adaptive"):
        assert all(torch.equal(a, b) for a, b in zip(runs[name][0], ref)), name
    assert runs["hisparse"][1].stats["fetched_rows"] > 0 and runs["adaptive"][1].stats["demoted_pages"] > 0


def test_adaptive_growth_from_free_pages_scans_no_requests(monkeypatch):
    """The scheduler asks can_grow for every running request every step: while free pages cover the growth,
    the answer must not scan every request for reclaimable pages (that scan made a batch-256 step host-bound)."""
    _, pol = drive(AdaptiveKV(num_blocks=200, top_k=4, block_size=2, tail_pages=1, host_num_blocks=200,
                              index_num_blocks=200), data(5))
    for slot in range(3):
        pol.blocks.grow(slot, 5)
    assert not pol.blocks.can_grow(0, 10**6)  # past the sequence limit: still refused
    monkeypatch.setattr(pol, "_reclaimable", lambda: pytest.fail("reclaimable scanned with free pages left"))
    assert pol.free and pol.blocks.can_grow(0, 6) and pol.blocks.can_grow(3, 5)


def test_short_views_select_every_position_without_scoring(monkeypatch):
    """While the view (view_blocks · block_size) is at most top_k, every position a query sees is in its top-k: the
    policies then attend over all of them without scoring or sorting, bitwise identically to each other, and equal
    (to rounding: the columns come in position order, not score order) to the scored selection."""
    from synodic.kv.indexer import KeyIndexer as KI
    from synodic.kv.topk import TopKPolicy
    wide = dict(top_k=64, block_size=2)                                       # 64 >= MAXLEN: every view is short
    tiered = dict(wide, hot_buffer=64, host_num_blocks=200, index_num_blocks=200)
    cfgs = {"resident": ResidentKV(num_blocks=200, **wide), "hisparse": HiSparseKV(num_blocks=200, **tiered),
            "adaptive": AdaptiveKV(num_blocks=200, tail_pages=1, promote_free_fraction=0.1, **tiered)}
    tensors = data(4)

    def no_scores(*a, **k):
        raise AssertionError("a short view scored its keys")
    with monkeypatch.context() as m:
        m.setattr(KI, "decode_scores", no_scores)
        fast = {name: drive(cfg, tensors)[0] for name, cfg in cfgs.items()}
    for name in ("hisparse", "adaptive"):
        assert all(torch.equal(a, b) for a, b in zip(fast[name], fast["resident"])), name
    monkeypatch.setattr(TopKPolicy, "selects_all", lambda self: False)
    scored, _ = drive(cfgs["resident"], tensors)
    assert len(scored) == len(fast["resident"])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fast["resident"], scored))
