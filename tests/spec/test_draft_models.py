"""Drafter models: the target's hidden-state taps and every drafter module against a plain-torch reference."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.graph import build_graph
from synodic.models.lm import PrefillContext
from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.spec.models import (
    DraftConfig,
    DraftModel,
    build_draft_model,
    load_draft_model,
    save_draft_model,
    shipped_drafter_dir,
)
from synodic.spec.models.draft import block_mask
from synodic.spec.models.layers import DynamicConv


def _manual_taps(model, ids, layers):
    """Block-by-block recomputation, x = x + mixer(norm(x)), without the fused residual add."""
    x = model.embed_tokens(ids)
    taps = {}
    for i, blk in enumerate(model.blocks):
        x = x + blk.mixer(blk.norm(x), None)
        taps[i] = x
    return torch.cat([taps[i] for i in layers], dim=-1), model.lm_head(model.norm_f(x))


@pytest.mark.parametrize("preset,layers", [("tiny_mamba2", (0, 4, 9)), ("tiny_gdn", (5, 1))])
def test_hidden_layers_equal_manual_recomputation(preset, layers):
    model = random_model(PRESETS[preset], seed=3)
    ids = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids)
        logits, hidden = model(ids, hidden_layers=layers)
        ref_hidden, ref_logits = _manual_taps(model, ids, layers)
    assert isinstance(plain, torch.Tensor)  # default path: logits only
    assert torch.equal(plain, logits)
    assert hidden.shape == (2, 13, len(layers) * model.config.hidden_size)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)


def test_hidden_layers_in_prefill_cover_every_position():
    cfg = compose(["model=tiny_mamba2", "model.weights=random", "runtime.device=cpu", "runtime.max_slots=2",
                   "kv.block_size=5", "kv.num_blocks=16"])
    graph = build_graph(cfg, max_seq_len=32)
    model = graph.model
    seq = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full_logits, full_hidden = model(seq, hidden_layers=(2, 7))
        graph.kv.blocks.grow(0, 9)
        logits, hidden = model(seq, PrefillContext(ssm=graph.ssm, kv=graph.kv, slots=[0]), hidden_layers=(2, 7))
    assert logits.shape[1] == 1 and hidden.shape == full_hidden.shape
    torch.testing.assert_close(hidden, full_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[:, 0], full_logits[:, -1], rtol=1e-4, atol=1e-4)


# ---- drafter modules vs plain loop references ---------------------------------------------------------------------

V, H = 53, 48  # odd vocabulary; hidden divisible by the conv group (16) and heads


def _small(scheme, **kw):
    fields = dict(scheme=scheme, vocab_size=V, hidden_size=H, target_layers=(0, 2), gamma=5, num_layers=2,
                  num_heads=3, num_kv_heads=1, head_dim=16, intermediate_size=40, markov_rank=7, selector_k=6,
                  selector_rank=5, seed=0)
    fields.update(kw)
    torch.manual_seed(11)
    m = DraftModel(DraftConfig(**fields))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() >= 2 else 0.5) + (1.0 if p.dim() == 1 else 0.0))
    tgt = SimpleNamespace(config=SimpleNamespace(vocab_size=V, hidden_size=H),
                          embed_tokens=nn.Embedding(V, H), lm_head=nn.Linear(H, V, bias=False))
    return m.bind_target(tgt)


def test_dynamic_conv_matches_loop_reference():
    torch.manual_seed(0)
    conv = DynamicConv(32, 8, 3)
    with torch.no_grad():
        conv.base.normal_()
        conv.proj.weight.normal_()
    B, N = 2, 11
    x = torch.randn(B, N, 32)
    first = torch.zeros(B, N, dtype=torch.bool)
    first[0, [0, 4, 9]] = True
    first[1, [0, 1, 6]] = True
    out = conv(x, first)
    ref = torch.empty_like(x)
    for b in range(B):
        for t in range(N):
            start = max(s for s in range(t + 1) if first[b, s])
            dyn = conv.proj.weight @ x[b, t]  # [groups * taps], group-major
            for c in range(32):
                acc = x[b, t, c]
                for j in range(3):
                    if t - j >= start:
                        acc = acc + (conv.base[c, j] + dyn[(c // 8) * 3 + j]) * x[b, t - j, c]
                ref[b, t, c] = acc
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_block_mask_matches_loop_reference():
    anchors = torch.tensor([[3, 1, 7], [2, 9, 5]])
    g, T, W = 2, 12, 4
    m = block_mask(anchors, g, T, W)
    n = g + 1
    for b in range(2):
        for r in range(3 * n):
            a = anchors[b, r // n].item()
            for j in range(T):
                assert m[b, r, j].item() == (a - W <= j < a)
            for c in range(3 * n):
                assert m[b, r, T + c].item() == (r // n == c // n)


def _naive_attention_block(model, hidden, tokens, anchor, g, W):
    """One block by hand: softmax over [context rows anchor-W..anchor-1 ; block rows], per head, no masking."""
    cfg = model.config
    x = torch.cat([model.embed(tokens[anchor])[None], model.mask_embedding[None].expand(g, H)])
    pos = torch.arange(anchor, anchor + g + 1)
    lo = max(0, anchor - W)
    ctx = model.fuse(hidden[lo:anchor])
    cpos = torch.arange(lo, anchor)
    first = torch.zeros(1, g + 1, dtype=torch.bool)
    first[0, 0] = True

    def rot(v, p):  # v [N, heads, d]
        half = cfg.head_dim // 2
        inv = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        out = torch.empty_like(v)
        for i in range(v.shape[0]):
            ang = p[i] * inv
            a, b = v[i, :, :half], v[i, :, half:]
            out[i, :, :half] = a * ang.cos() - b * ang.sin()
            out[i, :, half:] = b * ang.cos() + a * ang.sin()
        return out

    for layer in model.layers:
        at = layer.attn
        if layer.convs is not None:
            x = layer.convs[0](x[None], first)[0]
        h = layer.attn_norm(x)
        nrm = lambda t, w: F.rms_norm(t, (cfg.head_dim,), w, cfg.rms_norm_eps)  # noqa: E731
        q = rot(nrm(at.q_proj(h).view(-1, at.nh, at.d), at.q_norm.weight), pos)
        src = torch.cat([ctx, h])
        k = rot(nrm(at.k_proj(src).view(-1, at.nkv, at.d), at.k_norm.weight), torch.cat([cpos, pos]))
        v = at.v_proj(src).view(-1, at.nkv, at.d)
        o = torch.empty(g + 1, at.nh, at.d)
        for head in range(at.nh):
            kv = head // (at.nh // at.nkv)
            w = torch.softmax(q[:, head] @ k[:, kv].t() / at.d ** 0.5, dim=-1)
            o[:, head] = w @ v[:, kv]
        a = at.o_proj(o.reshape(g + 1, -1))
        if layer.convs is not None:
            a = layer.convs[1](a[None], first)[0]
        x = x + a
        if layer.convs is not None:
            x = layer.convs[2](x[None], first)[0]
        hh = layer.mlp_norm(x)
        mm = layer.down_proj(F.silu(layer.gate_proj(hh)) * layer.up_proj(hh))
        if layer.convs is not None:
            mm = layer.convs[3](mm[None], first)[0]
        x = x + mm
    return model.norm(x)[1:]


@pytest.mark.parametrize("scheme", ["dflash", "dflash2"])
def test_backbone_train_path_and_ring_equal_naive_blocks(scheme):
    torch.manual_seed(5)
    m = _small(scheme)
    T, g, W = 17, 4, 6
    hidden = torch.randn(2, T, 2 * H)
    tokens = torch.randint(0, V, (2, T))
    anchors = torch.tensor([[1, 9, 12, 5], [3, 12, 7, 10]])
    with torch.no_grad():
        h_train = m.train_blocks(hidden, tokens, anchors, gamma=g, window=W)
        m.allocate(3, W, "cpu", torch.float32)
        m.reset(torch.arange(3))
        for b in range(2):
            for a_i in range(4):
                a = anchors[b, a_i].item()
                ref = _naive_attention_block(m, hidden[b], tokens[b], a, g, W)
                torch.testing.assert_close(h_train[b, a_i], ref, rtol=1e-4, atol=1e-4)
        # ring: feed context in two uneven chunks (with invalid rows) to slot 2, then propose at anchor 12
        slots = torch.tensor([2])
        valid = torch.tensor([[True] * 7 + [False, True]])
        pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 40, 7]])
        m.append_context(slots, hidden[1:2, [0, 1, 2, 3, 4, 5, 6, 7, 7]], pos, valid)
        m.append_context(slots, hidden[1:2, 8:12], torch.arange(8, 12)[None], torch.ones(1, 4, dtype=torch.bool))
        captured = {}
        m.decode = lambda h, *a: captured.setdefault("h", h)  # the block rows before the heads
        m.propose(slots, tokens[1, 12:13], torch.tensor([12]), g, torch.zeros(1), None)
        del m.decode
        torch.testing.assert_close(captured["h"][0], h_train[1, 1], rtol=1e-4, atol=1e-4)


def test_markov_head_q_and_confidence_match_loop_reference():
    m = _small("dspark")
    torch.manual_seed(2)
    B, g = 3, 5
    h = torch.randn(B, g, H)
    anchors = torch.tensor([4, 17, 50])
    temp = torch.tensor([0.0, 1.0, 0.6])
    with torch.no_grad():
        m.confidence.temperature.copy_(torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0]))
        drafts, q = m.decode(h, anchors, temp, torch.Generator().manual_seed(0))
        conf = m.last_confidence
        Wlm = m._target[1].weight
        for b in range(B):
            prev = anchors[b].item()
            for k in range(g):
                logits = [sum(Wlm[v, c] * h[b, k, c] for c in range(H)).item() +
                          sum(m.markov.W1.weight[prev, r] * m.markov.W2.weight[v, r] for r in range(7)).item()
                          for v in range(V)]
                logits = torch.tensor(logits)
                if temp[b] == 0:
                    assert drafts[b, k].item() == logits.argmax().item()
                    assert q[b, k, drafts[b, k]].item() == 1.0
                else:
                    torch.testing.assert_close(q[b, k], torch.softmax(logits / temp[b], 0), rtol=1e-4, atol=1e-6)
                feat = torch.cat([h[b, k], m.markov.W1.weight[prev]])
                z = (m.confidence.w.weight[0] * feat).sum() + m.confidence.w.bias[0]
                torch.testing.assert_close(conf[b, k], torch.sigmoid(z / m.confidence.temperature[k]),
                                           rtol=1e-4, atol=1e-6)
                prev = drafts[b, k].item()


def test_path_selector_scores_and_walk_match_loop_reference():
    m = _small("dflash2")
    sel = m.selector
    torch.manual_seed(3)
    B, g, K = 2, 5, 6
    h = torch.randn(B, g, H)
    anchors = torch.tensor([7, 30])
    with torch.no_grad():
        U = m.head(h)
        cand = torch.randint(0, V, (B, K))
        s = sel.scores(anchors, h[:, 0], U[:, 0], cand)
        full = sel.full_scores(anchors, h[:, 0], U[:, 0])
        Hh = sel.H.weight @ h[:, 0].t()  # [r, B]
        for b in range(B):
            for i in range(K):
                bb = cand[b, i].item()
                ref = U[b, 0, bb] + sum(sel.A.weight[anchors[b], r] * Hh[r, b] * sel.B.weight[bb, r] for r in range(5))
                torch.testing.assert_close(s[b, i], ref, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(full[b, bb], ref, rtol=1e-4, atol=1e-5)
        temp = torch.tensor([0.0, 0.8])
        drafts, q = m.decode(h, anchors, temp, torch.Generator().manual_seed(1))
        for b in range(B):
            prev = anchors[b].item()
            for k in range(g):
                top = sorted(range(V), key=lambda v: -U[b, k, v].item())[:K]
                sc = {v: (U[b, k, v] + (sel.A.weight[prev] * (sel.H.weight @ h[b, k]) * sel.B.weight[v]).sum()).item()
                      for v in top}
                d = drafts[b, k].item()
                assert d in top and abs(q[b, k].sum().item() - 1) < 1e-5
                assert torch.count_nonzero(q[b, k]).item() <= K
                if temp[b] == 0:
                    assert d == max(sc, key=sc.get) and q[b, k, d].item() == 1.0
                else:
                    z = torch.softmax(torch.tensor([sc[v] for v in top]) / temp[b], 0)
                    torch.testing.assert_close(q[b, k, top], z, rtol=1e-4, atol=1e-6)
                prev = d


def test_sampled_drafts_follow_q():
    """Drafts drawn by propose's sampler have the empirical frequencies of the q it returns."""
    from synodic.spec.models.heads import sample
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0]]).expand(20000, 5)
    tok, q = sample(logits, torch.full((20000,), 0.7), torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=5).float() / 20000
    assert (freq - q[0]).abs().max() < 0.015  # ~5 sigma of a binomial at n=20000


@pytest.mark.parametrize("scheme", ["dflash", "dspark", "dflash2"])
def test_save_load_roundtrip_and_errors(tmp_path, scheme):
    tgt = random_model(PRESETS["tiny_gdn"], seed=1)
    m = build_draft_model(scheme, tgt.config, target=tgt, num_layers=1, gamma=3)
    save_draft_model(m, tmp_path / "d", storage="float32")
    m2 = load_draft_model(tmp_path / "d", tgt.config, target=tgt)
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert not any(k.startswith(("embed", "lm_head", "_target")) for k in m.state_dict())  # not stored
    assert all(t.shape != tgt.embed_tokens.weight.shape for t in m.state_dict().values())
    with pytest.raises(ConfigError, match="no such directory"):
        load_draft_model(tmp_path / "missing", tgt.config)
    with pytest.raises(ConfigError, match="hidden_size=384"):
        load_draft_model(tmp_path / "d", PRESETS["tiny_gdn"].model_copy(update={"hidden_size": 256}))
    (tmp_path / "d" / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="missing model.safetensors"):
        load_draft_model(tmp_path / "d", tgt.config)
    assert shipped_drafter_dir("no_such_target", scheme) is None


@pytest.mark.parametrize("scheme", ["dflash", "dspark", "dflash2"])
def test_greedy_decode_without_q_gives_the_temperature_zero_drafts(scheme):
    """decode with temperature None (the captured step's and teacher-forced scoring's greedy call) skips q and
    the sampling noise; its drafts are the temperature-0 drafts bit for bit, whatever the generator draws."""
    m = _small(scheme)
    torch.manual_seed(5)
    B, g = 9, 5
    h = torch.randn(B, g, H)
    anchors = torch.randint(0, V, (B,))
    with torch.no_grad():
        ref, q = m.decode(h, anchors, torch.zeros(B), torch.Generator().manual_seed(0))
        drafts, none = m.decode(h, anchors, None)
    assert none is None and q is not None
    assert torch.equal(drafts, ref) and drafts.dtype == torch.long and drafts.shape == (B, g)
    assert len(set(drafts.flatten().tolist())) > 3  # the rows differ: not a constant draft
