"""Learned DSA indexer (synodic/models/indexer.py + synodic/kv/indexer.py LearnedIndexer).

The module's scores equal the plain formula Σ_j w_j ReLU(q_j · k); prefill selection equals
teacher-forced decode selection; with the learned indexer the top-k policies stay bitwise identical
under forced misses, evictions, demotions and promotions (scripted, and through the engine on
tiny_dsa) while selecting other positions than the training-free indexer; `kv.indexer=learned`
without a learned indexer fails with one line; the ledger counts the learned key rows."""
from types import SimpleNamespace

import pytest
import test_kv_engine as kve
import test_kv_policies as kvp
import torch
import torch.nn.functional as F

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.graph import build_graph
from synodic.kv.config import AdaptiveKV, HiSparseKV, ResidentKV
from synodic.kv.indexer import KeyIndexer, LearnedIndexer
from synodic.kv.topk import TopKPolicy
from synodic.models.config import HybridConfig
from synodic.models.indexer import IndexerOut, LightningIndexer
from synodic.models.presets_dsa import DSA_PRESETS
from synodic.models.weights import random_model

H_I, D_I = 3, 6


def _rope_plain(x, pos, theta, rot):
    """Rotate-half RoPE written out: x [T, ..., D], pos [T]."""
    half = rot // 2
    out = x.clone()
    for t in range(x.shape[0]):
        for f in range(half):
            a = pos[t] * theta ** (-f / half)
            x1, x2 = x[t, ..., f].clone(), x[t, ..., f + half].clone()
            out[t, ..., f] = x1 * torch.cos(a) - x2 * torch.sin(a)
            out[t, ..., f + half] = x2 * torch.cos(a) + x1 * torch.sin(a)
    return out


def test_module_scores_equal_the_plain_formula():
    cfg = HybridConfig.model_validate({**DSA_PRESETS["tiny_dsa"].model_dump(), "hidden_size": 24,
                                       "index_n_heads": 3, "index_head_dim": 8, "index_rope_dim": 4})
    torch.manual_seed(0)
    mod = LightningIndexer(cfg)
    with torch.no_grad():
        mod.k_norm.weight.normal_()
        mod.k_norm.bias.normal_()
    T = 11
    h = torch.randn(1, T, 24)
    pos = torch.arange(T)
    with torch.no_grad():
        out = mod(h, pos).at(0)
    mod.requires_grad_(False)
    assert out.q.shape == (T, 3, 8) and out.w.shape == (T, 3) and out.k.shape == (T, 8)
    # plain torch, from the weights
    q = _rope_plain((h[0] @ mod.wq.weight.T).view(T, 3, 8), pos.double(), cfg.rope_theta, 4)
    k = F.layer_norm(h[0] @ mod.wk.weight.T, (8,), mod.k_norm.weight, mod.k_norm.bias, 1e-6)
    k = _rope_plain(k, pos.double(), cfg.rope_theta, 4)
    w = (h[0] @ mod.weights_proj.weight.T) / (3 * 8) ** 0.5
    want = torch.zeros(T, T, dtype=torch.float64)
    for n in range(T):
        for t in range(T):
            want[n, t] = sum(w[n, j].double() * max(0.0, float(q[n, j].double() @ k[t].double())) for j in range(3))
    with torch.no_grad():
        got = LightningIndexer.scores(out.q, out.w, out.k)
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4)
        # the KV side's scores: exact on fp32 keys, within fp8 / bf16 rounding on the cached ones
        assert torch.allclose(LearnedIndexer.scores(out.q, out.w, out.k[None], None).double(), want, atol=1e-5,
                              rtol=1e-4)
        for kind, tol in (("bf16", 2e-2), ("fp8", 8e-2)):
            ix = LearnedIndexer(1, 1, 4, 3, 8, kind, "cpu")
            kq, scale = ix.quantize(out.k)
            s = LearnedIndexer.scores(out.q, out.w, kq[None], None if scale is None else scale[None])
            assert ((s.double() - want).abs().max() / want.abs().max()) < tol, kind


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_prefill_selection_equals_teacher_forced_decode(kind):
    g = torch.Generator().manual_seed(1)
    T, bs, K = 37, 4, 5
    q, w, k = torch.randn(T, H_I, D_I, generator=g), torch.randn(T, H_I, generator=g), torch.randn(T, D_I, generator=g)
    k[::7] *= 3
    ix = LearnedIndexer(1, 16, bs, H_I, D_I, kind, "cpu")
    sel_prefill = ix.prefill_select((q, w), k, K, chunk=8)
    pages = torch.arange(-(-T // bs))
    ix.write(0, torch.arange(T), k)                 # page p holds positions p*bs .. p*bs + bs-1
    kq, scale = ix.quantize(k)
    full = LearnedIndexer.scores(q, w, kq[None], None if scale is None else scale[None])
    for p in range(T):
        s = ix.decode_scores(0, (q[p:p + 1], w[p:p + 1]), pages[None])
        assert torch.equal(s[0, : p + 1], full[p, : p + 1]), p
        assert torch.equal(KeyIndexer.select(s, torch.tensor([p]), K)[0], sel_prefill[p]), p
    assert ix.row_bytes() == (D_I + 4 if kind == "fp8" else 2 * D_I)
    # the batched-matmul path (CUDA's), in row blocks, gives the same scores up to summation order
    LearnedIndexer.CUDA_ELEMS, elems = 3 * T * H_I, LearnedIndexer.CUDA_ELEMS
    try:
        blocked = LearnedIndexer.scores(q, w, kq[None], None if scale is None else scale[None], einsum=True)
    finally:
        LearnedIndexer.CUDA_ELEMS = elems
    assert blocked.shape == full.shape and torch.allclose(blocked, full, atol=1e-4, rtol=1e-4)


# -- scripted schedule (tests/test_kv_policies.py's driver), with a learned indexer on the fake model ------------

class LearnedFakeModel(kvp.FakeModel):
    def __init__(self, dtype=torch.float32):
        super().__init__(dtype)
        for m in self.attention_layers:
            m.indexer = SimpleNamespace(n_heads=H_I, head_dim=D_I)


def _maps():
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(kvp.NQ * kvp.HD, H_I * D_I, generator=g), torch.randn(kvp.NQ * kvp.HD, H_I, generator=g),
             torch.randn(kvp.NKV * kvp.HD, D_I, generator=g)) for _ in range(kvp.NL)]


@pytest.fixture
def learned(monkeypatch):
    """drive() with LearnedFakeModel; the policies' attend / prefill_attend get index= computed from q, k
    by fixed per-layer maps (a stand-in for the attention layer's indexer). Returns the selections log."""
    maps = _maps()

    def index_of(i, q, k):
        A, B, C = maps[i]
        return IndexerOut((q.flatten(-2) @ A).unflatten(-1, (H_I, D_I)), q.flatten(-2) @ B, k.flatten(-2) @ C)
    attend, prefill = TopKPolicy.attend, TopKPolicy.prefill_attend
    monkeypatch.setattr(kvp, "FakeModel", LearnedFakeModel)
    monkeypatch.setattr(TopKPolicy, "attend", lambda self, i, q, k, v, index=None: attend(
        self, i, q, k, v, index=index_of(i, q, k)))
    monkeypatch.setattr(TopKPolicy, "prefill_attend", lambda self, i, slot, start, q, k, v, index=None: prefill(
        self, i, slot, start, q, k, v, index=index_of(i, q, k)))
    return record_selections(monkeypatch)


def record_selections(monkeypatch) -> list[torch.Tensor]:
    log = []
    select = KeyIndexer.select

    def rec(scores, pos, top_k):
        out = select(scores, pos, top_k)
        log.append(out.clone())
        return out
    monkeypatch.setattr(KeyIndexer, "select", staticmethod(rec))
    return log


@pytest.mark.parametrize("key_dtype", ["fp8", "bf16"])
def test_policies_bitwise_identical_with_the_learned_indexer(learned, key_dtype):
    tensors = kvp.data(1)
    cfgs = {n: c.model_copy(update={"learned_key_dtype": key_dtype}) for n, c in kvp.configs("learned").items()}
    runs = {}
    for name, cfg in cfgs.items():
        learned.clear()
        outs, pol = kvp.drive(cfg, tensors)
        runs[name] = outs, pol, list(learned)
        assert pol.learned_index and isinstance(pol.indexer, LearnedIndexer) and pol.indexer.kind == key_dtype
    ref, _, ref_sel = runs["resident"]
    for name in ("hisparse", "adaptive"):
        outs, _, sel = runs[name]
        assert len(outs) == len(ref) and all(torch.equal(a, b) for a, b in zip(outs, ref)), name
        assert len(sel) == len(ref_sel) and all(torch.equal(a, b) for a, b in zip(sel, ref_sel)), name
    his, ada = runs["hisparse"][1], runs["adaptive"][1]
    assert his.stats["fetched_rows"] > 3 * kvp.NL * his.B and all(f > 0 for f in his.stats_layers["fetched"])
    st = ada.stats
    assert st["demoted_pages"] > 0 and st["promoted_pages"] > 0
    assert st["install_rows_device"] > 0 and st["install_rows_host"] > 0
    assert 0 < st["fetched_rows"] < his.stats["fetched_rows"]
    # the learned path is the one used: the training-free indexer on the same model selects other positions
    learned.clear()
    kvp.drive(kvp.configs("bf16")["resident"], tensors)
    tf_sel = list(learned)
    assert len(tf_sel) == len(ref_sel)
    differ = sum(not torch.equal(a, b) for a, b in zip(tf_sel, ref_sel))
    assert differ > len(ref_sel) // 2, (differ, len(ref_sel))


def test_ledger_counts_learned_key_rows(learned):
    tensors = kvp.data(4)
    for key_dtype, row in (("fp8", D_I + 4), ("bf16", 2 * D_I)):
        for name, cfg in kvp.configs("learned").items():
            _, pol = kvp.drive(cfg.model_copy(update={"learned_key_dtype": key_dtype}), tensors, steps=3)
            led = pol.bytes_for([5, 9])
            assert pol.indexer.row_bytes() == row
            assert led["kv_index_read"] == 14 * kvp.NL * row, (name, key_dtype)
            assert led["kv_device_read"] == 8 * kvp.NL * pol.row_bytes() + led["kv_index_read"]
    _, pol = kvp.drive(kvp.configs("fp8")["resident"], tensors, steps=3)   # training-free: nkv * (hd + 4)
    assert pol.bytes_for([5, 9])["kv_index_read"] == 14 * kvp.NL * kvp.NKV * (kvp.HD + 4)


# -- through the model and the engine on tiny_dsa ----------------------------------------------------------------

DSA = ["model=tiny_dsa", "model.weights=random", "runtime.device=cpu"]


def test_tiny_dsa_carries_the_indexer_and_auto_picks_it():
    arch = DSA_PRESETS["tiny_dsa"]
    model = random_model(arch, 0)
    names = {n for n, _ in model.named_parameters() if ".indexer." in n}
    assert {"blocks.0.mixer.indexer.wq.weight", "blocks.0.mixer.indexer.wk.weight",
            "blocks.0.mixer.indexer.k_norm.weight", "blocks.0.mixer.indexer.weights_proj.weight"} <= names
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if n.endswith("indexer.wq.weight"))
    # without the indexer every other weight of the random init is the same
    plain = random_model(HybridConfig.model_validate({**arch.model_dump(), "index_n_heads": 0}), 0)
    sd = model.state_dict()
    assert all(torch.equal(v, sd[n]) for n, v in plain.state_dict().items())
    assert not any(".indexer." in n for n in plain.state_dict())
    ctx = SimpleNamespace(model=model, device=torch.device("cpu"), max_slots=2, max_seq_len=64)
    pols = {ix: ResidentKV(top_k=4, block_size=2, num_blocks=64, indexer=ix).build(ctx)
            for ix in ("auto", "learned", "bf16", "fp8")}
    assert pols["auto"].learned_index and pols["learned"].learned_index
    assert pols["auto"].indexer.row_bytes() == 32 + 4                 # fp8 k_I + scale, 36 B per token and layer
    assert not pols["bf16"].learned_index and pols["bf16"].indexer.row_bytes() == 2 * 288
    with pytest.raises(ValueError, match="index_rope_dim=3"):
        HybridConfig.model_validate({**arch.model_dump(), "index_rope_dim": 3})


def test_learned_without_an_indexer_fails_with_one_line():
    for ov in (["kv.top_k=4"], [], ["kv=hisparse"], ["kv=adaptive"]):
        cfg = compose(["model=tiny_mamba2", "model.weights=random", "runtime.device=cpu", "kv.indexer=learned", *ov])
        with pytest.raises(ConfigError) as e:
            build_graph(cfg, max_seq_len=64)
        assert len(e.value.lines) == 1 and "\n" not in e.value.lines[0]
        line = e.value.lines[0]
        assert line.startswith("kv.indexer='learned': ") and "index_n_heads" in line and "bf16" in line, line
    # auto on a model without one: the training-free bf16 indexer
    cfg = compose(["model=tiny_mamba2", "model.weights=random", "runtime.device=cpu", "kv.top_k=4"])
    kv = build_graph(cfg, max_seq_len=64).kv
    assert not kv.learned_index and kv.indexer.kind == "bf16"


def _serve_dsa(monkeypatch, overrides, **kw):
    monkeypatch.setattr(kve, "MODEL", DSA)
    return kve.serve(overrides, **kw)


def test_engine_tiny_dsa_bitwise_identical_across_policies(monkeypatch):
    log = record_selections(monkeypatch)
    runs, sels = {}, {}
    for name, ov in {"resident": ["kv=resident", *kve.TOPK, "kv.num_blocks=128"],
                     "hisparse": ["kv=hisparse", *kve.TIERED, "kv.num_blocks=64"],
                     "adaptive": ["kv=adaptive", *kve.TIERED, "kv.num_blocks=36", "kv.tail_pages=1"],
                     "training_free": ["kv=resident", *kve.TOPK, "kv.num_blocks=128", "kv.indexer=bf16"]}.items():
        log.clear()
        runs[name] = _serve_dsa(monkeypatch, ov)
        sels[name] = list(log)
        assert runs[name][0].graph.kv.learned_index == (name != "training_free")
    _, ref, ref_logits = runs["resident"]
    assert all(r.finish_reason == "length" and r.preemptions == 0 for r in ref)
    for name in ("hisparse", "adaptive"):
        eng, reqs, logits = runs[name]
        assert [r.output_ids for r in reqs] == [r.output_ids for r in ref], name
        assert len(logits) == len(ref_logits) and all(torch.equal(a, b) for a, b in zip(logits, ref_logits)), name
        assert len(sels[name]) == len(sels["resident"])
        assert all(torch.equal(a, b) for a, b in zip(sels[name], sels["resident"])), name
    kv = {name: run[0].ledger.summary()["kv"] for name, run in runs.items()}
    assert kv["hisparse"]["host_fetched_rows"] > 0 and kv["adaptive"]["host_fetched_rows"] > 0
    assert runs["adaptive"][0].graph.kv.stats["demoted_pages"] > 0
    # the learned indexer selects other positions than the training-free one (same model, same prompts)
    a, b = sels["resident"], sels["training_free"]
    n = min(len(a), len(b))
    assert sum(x.shape != y.shape or not torch.equal(x, y) for x, y in zip(a[:n], b[:n])) > n // 4
    # same lengths every step, so the index bytes scale with the key row: 36 B (fp8 k_I + scale) vs 576 B
    assert all(r.finish_reason == "length" for r in runs["training_free"][1])
    per_step = runs["resident"][0].ledger.summary()["bytes_per_step"]["kv_index_read"]
    tf_step = runs["training_free"][0].ledger.summary()["bytes_per_step"]["kv_index_read"]
    assert per_step > 0 and per_step * (2 * 288) == pytest.approx(tf_step * 36)


def test_engine_tiny_dsa_verify_windows_reproduce_greedy(monkeypatch):
    """Verify windows (attend_window with the learned index over T tokens) reproduce plain greedy decoding."""
    ov = ["kv=adaptive", *kve.TIERED, "kv.num_blocks=40", "kv.tail_pages=2"]
    _, plain, _ = _serve_dsa(monkeypatch, ov, prompts=kve.PROMPTS[:3])
    ref = {r.id: r.output_ids for r in plain}
    eng, reqs, _ = _serve_dsa(monkeypatch, ov, prompts=kve.PROMPTS[:3], window=3, drafter=kve.corrupting_drafter(ref))
    assert eng.graph.kv.learned_index
    assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs]


def test_hisparse_and_adaptive_configs_accept_the_indexer_fields():
    for cls in (HiSparseKV, AdaptiveKV):
        c = cls(indexer="learned", learned_key_dtype="bf16")
        assert c.indexer == "learned" and c.learned_key_dtype == "bf16"
        assert cls().indexer == "auto" and cls().learned_key_dtype == "fp8"
