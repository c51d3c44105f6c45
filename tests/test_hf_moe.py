"""Sparse MoE MLPs (synodic/models/moe.py): the grouped computation against the per-token reference on
odd shapes (both paths, both expert activations), the grouped sigmoid router against a per-token loop,
and Qwen3-Next / NemotronH MoE folders written by transformers against transformers' own forward in
prefill, decode steps, a verify window and greedy generation; the ledger counts the experts a step
actually read. (tests/test_hf_parity.py runs the NemotronH MoE folder through the full parity suite.)"""
import pytest
import torch

from synodic.models import moe


@pytest.mark.parametrize("act", ["silu", "relu2"])
@pytest.mark.parametrize("N", [3, 41])  # 3·3 pairs gather per pair, 41·3 group by expert
def test_grouped_matches_reference(N, act):
    g = torch.Generator().manual_seed(N)
    E, k, D, I = 5, 3, 13, 7
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    w_in, down = torch.randn(E, (2 if act == "silu" else 1) * I, D, generator=g, dtype=torch.float64), \
        torch.randn(E, D, I, generator=g, dtype=torch.float64)
    w, idx = moe.route(torch.randn(N, E, generator=g, dtype=torch.float64), k, True)
    assert torch.allclose(w.sum(-1), torch.ones(N, dtype=torch.float64))
    assert (N * k <= moe.GATHER_MAX_PAIRS) == (N == 3)
    want = moe.experts_ref(x, idx, w, w_in, down, act)
    assert torch.allclose(moe.experts_grouped(x, idx, w, w_in, down, act), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_group,topk_group,normalise", [(1, 1, True), (4, 2, True), (3, 1, False)])
def test_route_sigmoid_matches_per_token_loop(n_group, topk_group, normalise):
    g = torch.Generator().manual_seed(n_group)
    N, E, k, scale = 17, 12, 3, 2.5
    logits, bias = torch.randn(N, E, generator=g), torch.randn(E, generator=g) * 0.3
    w, idx = moe.route_sigmoid(logits, k, bias, n_group, topk_group, normalise, scale)
    assert w.dtype == torch.float32 and idx.shape == (N, k)
    for n in range(N):
        s = torch.sigmoid(logits[n])
        c = s + bias
        size = E // n_group
        gs = [sorted(c[i * size:(i + 1) * size].tolist())[-2:] for i in range(n_group)]
        groups = sorted(range(n_group), key=lambda i: -sum(gs[i]))[:topk_group]
        allowed = [e for e in range(E) if e // size in groups]
        chosen = sorted(allowed, key=lambda e: -float(c[e]))[:k]
        assert sorted(idx[n].tolist()) == sorted(chosen)
        ws = s[chosen]
        if normalise:
            ws = ws / ws.sum()
        got = dict(zip(idx[n].tolist(), w[n].tolist()))
        assert all(abs(got[e] - float(v) * scale) < 1e-6 for e, v in zip(chosen, ws))


def test_route_is_top_k_of_softmax():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, idx = moe.route(logits, 2, normalise=False)
    p = torch.softmax(logits, -1)
    assert idx.tolist() == [[1, 2]] and torch.allclose(w, p[:, [1, 2]])
    wn, _ = moe.route(logits, 2, normalise=True)
    assert torch.allclose(wn, p[:, [1, 2]] / p[:, [1, 2]].sum())


pytest.importorskip("transformers")

from hf_folders import write_folder  # noqa: E402

from synodic.config.compose import compose  # noqa: E402
from synodic.engine.engine import Engine  # noqa: E402
from synodic.engine.request import Request, SamplingParams  # noqa: E402
from synodic.graph import build_graph  # noqa: E402
from synodic.models.weights import load_checkpoint  # noqa: E402

PROMPT = [5, 9, 200, 31, 7, 250, 3, 18, 101]


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _ledger_and_verify(d, ref, k):
    """Decode steps then a 4-token verify window against transformers' whole-sequence forward; after a
    decode step each MoE layer has read exactly the k experts its token was routed to, and the step's
    weights_read counts them (plus every linear, the routers included)."""
    graph = build_graph(compose(["runtime.device=cpu", f"model.weights={d}"]), max_seq_len=64, window=4)
    eng = Engine(graph)
    graph.kv.blocks.grow(0, 64)
    ref.generation_config.eos_token_id = None
    with torch.no_grad():
        hf = ref.generate(torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False)[0].tolist()
        full = ref(torch.tensor([hf])).logits[0]
    n = len(PROMPT)
    assert rel(eng.runner.prefill(0, PROMPT), full[n - 1]) <= 1e-4
    for i in range(6):  # decode steps
        got = eng.runner.decode([0], [n + i], [hf[n + i]], max_len=64)[0]
        assert rel(got, full[n + i]) <= 1e-4
    moes = [b.mixer for b in graph.model.blocks if isinstance(b.mixer, moe.SparseMoE)]
    per = sum((m.w_in[0].numel() + m.down_proj[0].numel()) * 4 for m in moes)
    assert moes and all(int((m.hits > 0).sum()) == k for m in moes)
    from synodic.graph import linear_weight_bytes, moe_bytes_read
    assert moe_bytes_read(graph.model) == k * per
    wr = graph.step_bytes([0], [n + 6])["weights_read"]
    assert wr == linear_weight_bytes(graph.model, 1) + graph.embed_row_bytes + k * per
    win = eng.runner.verify([0], [n + 6], [hf[n + 6:n + 10]], max_len=64)[0]
    for t in range(4):
        assert rel(win[t], full[n + 6 + t]) <= 1e-4
    assert all(k <= int((m.hits > 0).sum()) <= 4 * k for m in moes)
    return graph, hf, n


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3_next_moe")
    return d, write_folder("qwen3_next_moe", d)


def test_moe_prefill_matches_transformers(folder):
    d, ref = folder
    model = load_checkpoint(d, progress=False)
    kinds = [type(b.mixer).__name__ for b in model.blocks[1::2]]
    assert kinds == ["SparseMoE", "MLP", "SparseMoE", "SparseMoE"]  # mlp_only_layers=[1]
    ids = torch.randint(0, 320, (2, 29), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(model(ids), ref(ids).logits) <= 1e-4


def test_moe_decode_verify_greedy_and_ledger(folder):
    d, ref = folder
    _, hf, n = _ledger_and_verify(d, ref, k=2)  # 2 of 6 experts per MoE layer and decode step
    # greedy through the engine, token for token
    graph2 = build_graph(compose(["runtime.device=cpu", f"model.weights={d}", "ssm=replay"]), max_seq_len=64)
    req = Request(0, PROMPT, SamplingParams(max_tokens=32))
    eng2 = Engine(graph2)
    eng2.generate([req])
    assert req.output_ids == hf[n:]


@pytest.fixture(scope="module")
def nemotron_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("nemotron_h_moe")
    return d, write_folder("nemotron_h_moe", d)


def test_nemotron_moe_layers_ledger_and_verify(nemotron_folder):
    d, ref = nemotron_folder
    graph, _, _ = _ledger_and_verify(d, ref, k=3)
    kinds = [type(b.mixer).__name__ for b in graph.model.blocks]
    assert kinds == ["Mamba2Mixer", "SparseMoE", "Attention", "Mamba2Mixer", "MLP", "SparseMoE", "Mamba2Mixer"]
    m = graph.model.blocks[1].mixer
    assert isinstance(m.gate, moe.SigmoidRouter) and m.shared_expert_gate is None and m.act == "relu2"
    # the router's weight is part of every step's linear bytes (fp32: 8 experts x 64)
    from synodic.graph import linear_weight_bytes
    assert m.gate.weight_bytes() == 8 * 64 * 4 and linear_weight_bytes(graph.model) > m.gate.weight_bytes()


def test_nemotron_router_stays_fp32_in_a_bf16_model(nemotron_folder):
    from synodic.models.hf import load_hf
    d, _ = nemotron_folder
    model = load_hf(d, "cpu", torch.bfloat16, progress=False)
    m = model.blocks[1].mixer
    assert m.gate.weight.dtype == m.gate.e_score_correction_bias.dtype == torch.float32
    assert m.up_proj.dtype == torch.bfloat16
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.isfinite(model(ids)).all()


def test_nemotron_latent_moe_and_stacked_layout(tmp_path):
    """moe_latent_size: the routed experts run between fc1 / fc2 latent projections; transformers' in-memory
    layout (model.* names, stacked experts.up_proj / down_proj) loads to the same parameters."""
    from safetensors.torch import save_file
    d = tmp_path / "latent"
    ref = write_folder("nemotron_h_moe", d, moe_latent_size=16)
    model = load_checkpoint(d, progress=False)
    assert model.blocks[1].mixer.up_proj.shape == (8, 24, 16)
    ids = torch.randint(0, 320, (2, 23), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(ids).logits
        assert rel(model(ids), want) <= 1e-4
    s = tmp_path / "stacked"
    s.mkdir()
    (s / "config.json").write_text((d / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(s / "model.safetensors"))
    assert any(k.endswith("experts.up_proj") for k in ref.state_dict())
    a, b = model.state_dict(), load_checkpoint(s, progress=False).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
