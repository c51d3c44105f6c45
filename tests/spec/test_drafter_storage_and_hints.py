"""Compact drafter files and lookup hints: fp8 rows with per-row scales against a loop reference and through a
file round trip (the target's embedding / LM head never stored); the vectorised prompt-lookup hints equal
spec=ngram's host lookup; a hinted drafter's ring propose equals its teacher-forced training path."""
import pytest
import torch

from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.spec.models import (
    DraftConfig,
    DraftModel,
    build_draft_model,
    dequantize_rows,
    load_draft_model,
    quantize_rows,
    save_draft_model,
)
from synodic.spec.models.lookup import host_hints, lookup_hints


def test_fp8_rows_match_loop_reference():
    w = torch.randn(37, 29) * torch.logspace(-3, 1, 37)[:, None]  # rows of very different ranges
    codes, scale = quantize_rows(w)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (37,)
    for r in range(37):
        s = w[r].abs().max() / 448.0
        assert torch.allclose(scale[r], s)
        ref = (w[r] / s).to(torch.float8_e4m3fn).float() * s
        torch.testing.assert_close(dequantize_rows(codes, scale)[r], ref)
    rel = (dequantize_rows(codes, scale) - w).abs() / w.abs().amax(1, keepdim=True)
    assert rel.max() < 2 ** -4  # e4m3: 3 mantissa bits, relative to each row's own maximum


@pytest.mark.parametrize("scheme", ["dspark", "dflash2"])
def test_fp8_file_round_trip(tmp_path, scheme):
    tgt = random_model(PRESETS["tiny_gdn"], seed=1)
    m = build_draft_model(scheme, tgt.config, target=tgt, num_layers=1, gamma=3, intermediate_size=256)
    if scheme == "dspark":
        m.confidence.temperature.fill_(1.7)
    fp8 = save_draft_model(m, tmp_path / "d") / "model.safetensors"
    m2 = load_draft_model(tmp_path / "d", tgt.config, target=tgt)
    for k, a in m.state_dict().items():
        b = m2.state_dict()[k]
        if a.dim() >= 2 and a.numel() >= 4096:
            torch.testing.assert_close(b, dequantize_rows(*quantize_rows(a)))
        else:  # vectors, small matrices, calibration temperatures: exact
            assert torch.equal(a, b), k
    from safetensors import safe_open
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]
    assert list(tgt.embed_tokens.weight.shape) not in shapes  # the shared embedding / head is not stored
    params = sum(p.numel() for p in m.parameters())
    assert fp8.stat().st_size < 1.1 * params + 65536  # about one byte a parameter


def test_lookup_hints_equal_host_lookup():
    g = torch.Generator().manual_seed(0)
    for _ in range(25):
        T = int(torch.randint(3, 40, (1,), generator=g))
        V = int(torch.randint(2, 6, (1,), generator=g))  # small vocabularies: many repeats
        tok = torch.randint(0, V, (3, T), generator=g)
        anchors = torch.randint(0, T, (3, 5), generator=g)
        for mx, mn in ((4, 1), (3, 2), (1, 1)):
            got = lookup_hints(tok, anchors, 6, mx, mn)
            for b in range(3):
                ref = host_hints([tok[b, :p + 1].tolist() for p in anchors[b].tolist()], 6, mx, mn)
                assert torch.equal(got[b], ref), (tok[b], anchors[b], mx, mn)


def test_history_hints_read_only_the_committed_context():
    """history_hints over a device token history (ModelRunner.track_history): the anchor is written at its
    position, and what lies past it (a rejected window's drafts, an earlier request's tokens) changes nothing:
    equal to the host lookup of the committed context plus the anchor."""
    from synodic.spec.models.lookup import history_hints
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        W, V = 24, 4
        hist = torch.randint(0, V, (4, W), generator=g)
        rows, pos = torch.tensor([2, 0, 3]), torch.randint(0, W, (3,), generator=g)
        anchors = torch.randint(0, V, (3,), generator=g)
        ctx = [hist[r, :p].tolist() + [a] for r, p, a in zip(rows.tolist(), pos.tolist(), anchors.tolist())]
        got = history_hints(hist, rows, anchors, pos, 5, 3, 1)
        assert torch.equal(got, host_hints(ctx, 5, 3, 1)), (ctx, got)


def test_hinted_ring_propose_equals_training_path():
    V, H = 11, 48
    cfg = DraftConfig(scheme="dflash", vocab_size=V, hidden_size=H, target_layers=(0, 2), gamma=4, num_layers=2,
                      num_heads=3, num_kv_heads=1, head_dim=16, intermediate_size=40, lookup_hint=3)
    torch.manual_seed(3)
    m = DraftModel(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    emb, head = torch.nn.Embedding(V, H), torch.nn.Linear(H, V, bias=False)
    object.__setattr__(m, "_target", (emb, head))
    T = 20
    tokens = torch.randint(0, 4, (1, T))  # few distinct tokens: the lookup finds matches
    hidden = torch.randn(1, T, 2 * H)
    anchors = torch.tensor([[6, 13, 17]])
    with torch.no_grad():
        h_train = m.train_blocks(hidden, tokens, anchors, gamma=4)
        m.allocate(1, 32, "cpu", torch.float32)
        slots = torch.tensor([0])
        m.reset(slots)
        m.append_context(slots, hidden, torch.arange(T)[None], torch.ones(1, T, dtype=torch.bool))
        for i, a in enumerate(anchors[0].tolist()):
            captured: dict = {}
            m.decode = lambda h, *args, c=captured: c.setdefault("h", h)
            hints = host_hints([tokens[0, :a + 1].tolist()], 4, 3)
            m.propose(slots, tokens[0, a:a + 1], torch.tensor([a]), 4, torch.zeros(1), None, hints=hints)
            del m.decode
            torch.testing.assert_close(captured["h"][0], h_train[0, i], rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="lookup hints"):
            m.propose(slots, tokens[0, 6:7], torch.tensor([6]), 4, torch.zeros(1), None)
