"""Sparse MoE MLPs (synodic/models/moe.py): the grouped computation against the per-token reference on
odd shapes (both paths), and a Qwen3-Next MoE folder written by transformers against transformers'
own forward in prefill, decode steps, a verify window and greedy generation; the ledger counts the
experts a step actually read."""
import pytest
import torch

from synodic.models import moe


@pytest.mark.parametrize("N", [3, 41])  # 3·3 pairs gather per pair, 41·3 group by expert
def test_grouped_matches_reference(N):
    g = torch.Generator().manual_seed(N)
    E, k, D, I = 5, 3, 13, 7
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    gate_up, down = torch.randn(E, 2 * I, D, generator=g, dtype=torch.float64), \
        torch.randn(E, D, I, generator=g, dtype=torch.float64)
    w, idx = moe.route(torch.randn(N, E, generator=g, dtype=torch.float64), k, True)
    assert torch.allclose(w.sum(-1), torch.ones(N, dtype=torch.float64))
    assert (N * k <= moe.GATHER_MAX_PAIRS) == (N == 3)
    want = moe.experts_ref(x, idx, w, gate_up, down)
    assert torch.allclose(moe.experts_grouped(x, idx, w, gate_up, down), want, rtol=1e-12, atol=1e-12)


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
    # one decode step reads the experts its token was routed to: 2 of 6 per MoE layer
    moes = [b.mixer for b in graph.model.blocks if isinstance(b.mixer, moe.SparseMoE)]
    per = sum((m.gate_up_proj[0].numel() + m.down_proj[0].numel()) * 4 for m in moes)
    assert all(int((m.hits > 0).sum()) == 2 for m in moes)
    from synodic.graph import linear_weight_bytes, moe_bytes_read
    assert moe_bytes_read(graph.model) == 2 * per
    wr = graph.step_bytes([0], [n + 6])["weights_read"]
    assert wr == linear_weight_bytes(graph.model, 1) + graph.embed_row_bytes + 2 * per
    # a verify window of 4 tokens after the 6 decoded ones
    win = eng.runner.verify([0], [n + 6], [hf[n + 6:n + 10]], max_len=64)[0]
    for t in range(4):
        assert rel(win[t], full[n + 6 + t]) <= 1e-4
    assert all(2 <= int((m.hits > 0).sum()) <= 6 for m in moes)
    # greedy through the engine, token for token
    graph2 = build_graph(compose(["runtime.device=cpu", f"model.weights={d}", "ssm=replay"]), max_seq_len=64)
    req = Request(0, PROMPT, SamplingParams(max_tokens=32))
    eng2 = Engine(graph2)
    eng2.generate([req])
    assert req.output_ids == hf[n:]
