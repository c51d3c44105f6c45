"""Model substrate: chunked scans equal the recurrences; prefill + decode equals a token-by-token run
equals the whole-sequence forward, for both tiny presets."""
import pytest
import torch
import torch.nn.functional as F

from synodic.config.compose import compose
from synodic.engine.runner import ModelRunner
from synodic.graph import build_graph
from synodic.models.scan import gdn_chunked, gdn_sequential, mamba2_chunked, mamba2_sequential


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_mamba2_chunked_matches_sequential():
    g = torch.Generator().manual_seed(1)
    b, T, H, P, G, N = 2, 29, 6, 5, 3, 7
    x = torch.randn(b, T, H, P, generator=g)
    dt = torch.rand(b, T, H, generator=g) * 0.5
    A = -torch.rand(H, generator=g) * 2
    B, C = torch.randn(b, T, G, N, generator=g), torch.randn(b, T, G, N, generator=g)
    S0 = torch.randn(b, H, P, N, generator=g)
    y1, s1 = mamba2_chunked(x, dt, A, B, C, 8, S0)
    y2, s2 = mamba2_sequential(x, dt, A, B, C, S0)
    assert _rel(y1, y2) < 1e-5 and _rel(s1, s2) < 1e-5


def test_gdn_chunked_matches_sequential():
    g = torch.Generator().manual_seed(2)
    b, T, HV, K, V = 2, 23, 3, 9, 5
    q = F.normalize(torch.randn(b, T, HV, K, generator=g), dim=-1)
    k = F.normalize(torch.randn(b, T, HV, K, generator=g), dim=-1)
    v = torch.randn(b, T, HV, V, generator=g)
    gl, beta = -torch.rand(b, T, HV, generator=g), torch.rand(b, T, HV, generator=g)
    S0 = torch.randn(b, HV, V, K, generator=g)
    o1, s1 = gdn_chunked(q, k, v, gl, beta, 8, S0)
    o2, s2 = gdn_sequential(q, k, v, gl, beta, S0)
    assert _rel(o1, o2) < 1e-5 and _rel(s1, s2) < 1e-5


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
def test_prefill_decode_equals_token_by_token_and_forward(preset):
    # small odd shapes keep it fast; random weights so the test does not depend on shipped ones
    cfg = compose([f"model={preset}", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=3",
                   "kv.block_size=5", "kv.num_blocks=32"])
    graph = build_graph(cfg, max_seq_len=40)
    runner = ModelRunner(graph.model, graph.ssm, graph.kv, 3, "cpu", False)
    torch.manual_seed(0)
    seq = torch.randint(0, graph.model.config.vocab_size, (19,)).tolist()
    with torch.no_grad():
        full = graph.model(torch.tensor(seq)[None])[0]
    for slot in range(2):
        graph.kv.blocks.grow(slot, len(seq))
    # slot 0: prefill 11 tokens, decode the rest; slot 1: prefill 1 token, decode everything else
    outs = {0: [runner.prefill(0, seq[:11])], 1: [runner.prefill(1, seq[:1])]}
    for t in range(1, len(seq)):
        rows = [s for s, start in ((0, 11), (1, 1)) if t >= start]
        logits = runner.decode(rows, [t] * len(rows), [seq[t]] * len(rows), t + 1)
        for i, s in enumerate(rows):
            outs[s].append(logits[i])
    a, b = torch.stack(outs[0]), torch.stack(outs[1])
    assert _rel(a, full[10:]) < 1e-4
    assert _rel(b, full) < 1e-4
