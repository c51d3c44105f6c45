"""rope_dtype: Triton kernel vs torch reference (odd head counts, head widths not a power of two, bf16 bit for
bit, fp32 to rounding), and the drafter's apply_rope gives the same without autograd as with."""
import pytest
import torch
from kernel_errors import assert_elementwise_matches, rel_max
from synodic.kernels.rope_dtype import rope_dtype

from synodic.spec.models.layers import apply_rope, rope_cos_sin

CASES = [  # (B, N, heads, d, dtype)
    (1, 4, 6, 64, torch.bfloat16),   # the drafter's inference shape (q heads)
    (2, 5, 3, 48, torch.bfloat16),   # d not a power of two
    (3, 7, 70, 16, torch.float32),   # many heads: several head blocks
    (1, 1, 1, 2, torch.float32),
]


@pytest.mark.parametrize("B,N,H,D,dtype", CASES)
def test_triton_matches_ref(B, N, H, D, dtype, device):
    gen = torch.Generator().manual_seed(B * 1000 + N * 10 + H + D)
    x = torch.randn(B, N, H, D, generator=gen).to(dtype).to(device)
    pos = torch.randint(0, 5000, (B, N), generator=gen).to(device)
    cos, sin = rope_cos_sin(pos, D, 10000.0, dtype)
    y = rope_dtype(x, cos, sin, backend="triton")
    y_ref = rope_dtype(x, cos, sin, backend="ref")
    assert y.shape == x.shape and y.dtype == dtype
    assert_elementwise_matches(y, y_ref)


def test_apply_rope_inference_equals_autograd_form(device):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 32, generator=gen).to(device)
    cos, sin = rope_cos_sin(torch.arange(6, device=device).view(2, 3), 32, 10000.0, x.dtype)
    with torch.no_grad():
        fused = apply_rope(x, cos, sin)
    ref = apply_rope(x, cos, sin)
    assert torch.equal(fused, ref) if x.device.type == "cpu" else rel_max(fused, ref) < 1e-5  # FMAs when compiled


def test_errors(device):
    x = torch.zeros(1, 2, 3, 8, device=device)
    cs = torch.zeros(1, 2, 4, device=device)
    with pytest.raises(ValueError, match="d even"):
        rope_dtype(x[..., :7], cs, cs)
    with pytest.raises(ValueError, match="cos"):
        rope_dtype(x, cs[..., :3], cs)
    with pytest.raises(ValueError, match="sin"):
        rope_dtype(x, cs, cs.double())
