"""The drafter's fused inference kernels (dynamic_conv, rope_dtype) against its torch form, end to end in bf16:
the same drafts and block rows bit for bit, and the same ring after an append. Triton runs under the
interpreter without a GPU."""
import synodic.kernels.dynamic_conv as dynamic_conv_pkg
import synodic.kernels.rope_dtype as rope_dtype_pkg
import torch

from synodic.models.lm import HybridLM
from synodic.models.presets import PRESETS
from synodic.spec.models import build_draft_model


def _drafter(device):
    cfg = PRESETS["tiny_mamba2"]
    target = HybridLM(cfg).init_weights(0).to(device, torch.bfloat16)
    model = build_draft_model("dflash2", cfg, target=target, seed=3).to(device, torch.bfloat16)
    model.allocate(3, 32, device, torch.bfloat16)
    return cfg, model


def test_fused_drafts_equal_torch_form(device, monkeypatch):
    cfg, model = _drafter(device)
    g = torch.Generator().manual_seed(0)
    slots = torch.tensor([0, 1, 2], device=device)
    hidden = torch.randn(3, 12, 3 * cfg.hidden_size, generator=g).to(device, torch.bfloat16)
    pos = torch.arange(12, device=device).expand(3, 12)
    valid = torch.ones(3, 12, dtype=torch.bool, device=device)
    anchors = torch.tensor([5, 77, 1000], device=device)
    at = torch.full((3,), 12, device=device)
    got = {}
    for be in ("ref", "triton"):
        for pkg in (dynamic_conv_pkg, rope_dtype_pkg):
            monkeypatch.setattr(pkg, "pick_backend", lambda _b, _t, be=be: be)
        model.reset(slots)
        model.append_context(slots, hidden, pos, valid)
        ring = model._ring["kv"].clone()
        with torch.no_grad():
            drafts, _ = model.propose(slots, anchors, at, 3, None)
            x = model.block_inputs(anchors, 3)
            ctx = model._ring["kv"][:, :, slots]
            rows = model.run_layers(x, at[:, None] + torch.arange(4, device=device),
                                    (torch.arange(4, device=device) == 0).expand(3, 4),
                                    [(ctx[i, 0], ctx[i, 1]) for i in range(len(model.layers))],
                                    torch.ones(3, 4, 33 + 4, dtype=torch.bool, device=device))
        got[be] = (drafts, rows, ring)
    if device == "cpu" or getattr(device, "type", device) == "cpu":  # the interpreter rounds as the torch form
        for a, b in zip(got["ref"], got["triton"]):
            assert torch.equal(a, b)
    else:  # compiled kernels contract to FMAs: block rows within bf16 rounding (drafts may flip at near ties)
        assert torch.equal(got["ref"][2], got["triton"][2])
        r, t = got["ref"][1].float(), got["triton"][1].float()
        assert ((r - t).abs().max() / r.abs().max()).item() < 2e-2
