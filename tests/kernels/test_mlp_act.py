"""mlp_act: Triton kernel vs torch reference (odd widths, strided rows, bf16 / fp32), argument errors."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.mlp_act import mlp_act


@pytest.mark.parametrize("act", ["silu", "relu2"])
@pytest.mark.parametrize("rows,D,dtype", [(3, 37, torch.float32), (5, 1100, torch.bfloat16), (1, 8, torch.bfloat16),
                                          (4, 2049, torch.float16)])
def test_triton_matches_ref(act, rows, D, dtype, device):
    gen = torch.Generator().manual_seed(rows * 1000 + D)
    # gate and up as the two halves of one projection's output (row-strided views), plus a leading dim
    proj = (torch.randn(rows, 1, 2 * D, generator=gen) * 3).to(dtype).to(device)
    gate, up = proj[..., :D], (proj[..., D:] if act == "silu" else None)
    y = mlp_act(gate, up, act=act, backend="triton")
    y_ref = mlp_act(gate, up, act=act, backend="ref")
    assert y.shape == gate.shape and y.dtype == dtype
    # one rounding (kernel) vs one per op (reference): within two low-precision ulps
    assert rel_max(y, y_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    if act == "relu2":
        assert (y[gate <= 0] == 0).all()


def test_argument_errors():
    g = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="act: expected one of"):
        mlp_act(g, g, act="gelu")
    with pytest.raises(ValueError, match="up: act 'silu' needs"):
        mlp_act(g, act="silu")
    with pytest.raises(ValueError, match="up: act 'relu2' takes no"):
        mlp_act(g, g, act="relu2")
    with pytest.raises(ValueError, match="up: expected shape"):
        mlp_act(g, torch.zeros(2, 7), act="silu")
    with pytest.raises(ValueError, match="gate: expected"):
        mlp_act(g.long(), act="relu2")
