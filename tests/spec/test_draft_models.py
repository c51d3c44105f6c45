"""Drafter models: the target's hidden-state taps and every drafter module against a plain-torch reference."""
import pytest
import torch

from synodic.config.compose import compose
from synodic.graph import build_graph
from synodic.models.lm import PrefillContext
from synodic.models.presets import PRESETS
from synodic.models.weights import random_model


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
