"""dynamic_conv: Triton kernel vs torch reference (odd widths, groups, 2..3 taps, several blocks a row, strided x,
bf16 bit for bit, fp32 to rounding), and the drafter's DynamicConv gives the same without autograd as with."""
import pytest
import torch
from kernel_errors import assert_elementwise_matches, rel_max
from synodic.kernels.dynamic_conv import dynamic_conv

from synodic.spec.models.layers import DynamicConv, block_starts

CASES = [  # (B, N, H, group, taps, dtype)
    (1, 4, 48, 16, 2, torch.bfloat16),   # one block, the drafter's inference shape
    (2, 9, 40, 8, 3, torch.bfloat16),    # several blocks a row
    (3, 7, 1100, 4, 2, torch.float32),   # two channel blocks, the last one partial
    (2, 5, 6, 3, 4, torch.float32),      # taps longer than some blocks
]


def _firsts(B, N, gen):
    first = torch.rand(B, N, generator=gen) < 0.35
    first[:, 0] = True
    return first


@pytest.mark.parametrize("B,N,H,group,taps,dtype", CASES)
def test_triton_matches_ref(B, N, H, group, taps, dtype, device):
    gen = torch.Generator().manual_seed(B * 100 + N + H)
    wide = torch.randn(B, N, H + 5, generator=gen).to(dtype).to(device)
    x = wide[..., 2:2 + H]  # a strided view
    dyn = (torch.randn(B, N, H // group * taps, generator=gen) * 0.5).to(dtype).to(device)
    base = (torch.randn(H, taps, generator=gen) * 0.5).to(dtype).to(device)
    start = block_starts(_firsts(B, N, gen).to(device))
    y = dynamic_conv(x, dyn, base, start, group, backend="triton")
    y_ref = dynamic_conv(x, dyn, base, start, group, backend="ref")
    assert y.shape == (B, N, H) and y.dtype == dtype
    assert_elementwise_matches(y, y_ref)


def test_module_inference_equals_autograd_form(device):
    """DynamicConv without autograd (the fused path) = its training form, on blocks of the inference layout."""
    gen = torch.Generator().manual_seed(0)
    conv = DynamicConv(32, 8, 3).to(device)
    with torch.no_grad():
        conv.base.copy_(torch.randn(32, 3, generator=gen))
    x = torch.randn(2, 8, 32, generator=gen).to(device)
    first = torch.zeros(2, 8, dtype=torch.bool, device=device)
    first[:, [0, 4]] = True
    with torch.no_grad():
        fused = conv(x, first)
    ref = conv(x, first).detach()
    assert torch.equal(fused, ref) if x.device.type == "cpu" else rel_max(fused, ref) < 1e-5  # FMAs when compiled


def test_errors(device):
    x = torch.zeros(1, 3, 8, device=device)
    base = torch.zeros(8, 2, device=device)
    start = torch.zeros(1, 3, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="group"):
        dynamic_conv(x, torch.zeros(1, 3, 4, device=device), base, start, 3)
    with pytest.raises(ValueError, match="dyn"):
        dynamic_conv(x, torch.zeros(1, 3, 5, device=device), base, start, 4)
    with pytest.raises(ValueError, match="start"):
        dynamic_conv(x, torch.zeros(1, 3, 4, device=device), base, start.float(), 4)
