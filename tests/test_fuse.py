"""Fused projections: one GEMM over a shared weight storage gives the separate linears' outputs, keeps parameter
names / state_dict / in-place loads, and falls back when a module or its weight is replaced or autograd records."""
import torch
from torch import nn

from synodic.models.config import HybridConfig
from synodic.models.fuse import fuse_projections, project
from synodic.models.lm import HybridLM
from synodic.models.presets import PRESETS
from synodic.models.weights import load_checkpoint, save_checkpoint


def _model(name):
    torch.manual_seed(0)
    return HybridLM(PRESETS[name]).init_weights(1).eval()


def test_fused_model_outputs_and_state_dict_unchanged():
    for name in ("tiny_gdn", "tiny_mamba2"):
        m = _model(name)
        ids = torch.randint(0, 4096, (2, 9))
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        with torch.no_grad():
            ref = m(ids)
            n = fuse_projections(m)
            out = m(ids)
        groups = [mod for mod in m.modules() if hasattr(mod, "FUSED_PROJECTIONS")
                  and all(hasattr(mod, a) for a in mod.FUSED_PROJECTIONS)]  # relu2 MLPs have no gate_proj
        assert n == len(groups) > 0
        # the same products summed in one GEMM: equal up to the GEMM's blocking
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
        sd2 = m.state_dict()
        assert sd2.keys() == sd.keys() and all(torch.equal(sd2[k], sd[k]) for k in sd)


def test_fused_weights_follow_inplace_loads_and_fall_back_on_replacement():
    cfg = HybridConfig(**{**PRESETS["tiny_gdn"].model_dump(), "num_hidden_layers": 4})
    m = HybridLM(cfg).init_weights(2).eval()
    fuse_projections(m)
    mlp = next(mod for mod in m.modules() if hasattr(mod, "gate_proj"))
    x = torch.randn(3, 1, cfg.hidden_size)
    with torch.no_grad():
        mlp.up_proj.weight.copy_(torch.randn_like(mlp.up_proj.weight))  # an in-place load reaches the fused GEMM
        g, u = project(mlp, mlp.FUSED_PROJECTIONS, x)
        assert torch.allclose(u, mlp.up_proj(x), rtol=1e-4, atol=1e-5)
        mlp.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # e.g. a quantized swap
        g2, u2 = project(mlp, mlp.FUSED_PROJECTIONS, x)
        assert torch.equal(u2, mlp.up_proj(x)) and torch.equal(g2, mlp.gate_proj(x))
    # with autograd the separate linears run (the fused weight is not a parameter)
    y = project(mlp, mlp.FUSED_PROJECTIONS, x)[0].sum()
    y.backward()
    assert mlp.gate_proj.weight.grad is not None


def test_fused_model_saves_and_reloads(tmp_path):
    m = _model("tiny_gdn")
    fuse_projections(m)
    save_checkpoint(m, tmp_path)  # parameters that are row blocks of one fused storage
    back = load_checkpoint(tmp_path)
    sd, sd2 = m.state_dict(), back.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
