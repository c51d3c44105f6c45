"""rope_norm: Triton kernel vs torch reference (partial / full rotation, odd head counts and dims, with and
without the per-head norm, strided inputs, prefill / decode shapes), argument errors."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.rope import rope_cs, rope_norm


@pytest.mark.parametrize("lead,H,D,rot,norm,dtype", [
    ((3, 1), 5, 64, 16, True, torch.bfloat16),     # decode [B, 1, H, D], partial rotation, QK-norm
    ((1, 7), 3, 96, 96, False, torch.float32),     # prefill [1, T, H, D], full rotation
    ((2, 4), 4, 256, 64, True, torch.float32),     # verify window, GDN-preset head size
    ((5, 1), 9, 40, 10, False, torch.bfloat16),    # D not a power of two, odd half
])
def test_triton_matches_ref(lead, H, D, rot, norm, dtype, device):
    gen = torch.Generator().manual_seed(H * D + rot)
    # x as a view of a wider projection output (row-strided), like q / k after unflatten
    proj = (torch.randn(*lead, H * D + 8, generator=gen) * 2).to(dtype).to(device)
    x = proj[..., 3:3 + H * D].unflatten(-1, (H, D))
    pos = torch.randint(0, 5000, lead, generator=gen).to(device)
    cos, sin = rope_cs(pos if lead[0] > 1 else pos[0], 1e4, rot)
    w = (torch.rand(D, generator=gen) + 0.5).to(dtype).to(device) if norm else None
    y = rope_norm(x, cos, sin, rot, w, 1e-6, backend="triton")
    y_ref = rope_norm(x, cos, sin, rot, w, 1e-6, backend="ref")
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_max(y, y_ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    if not norm:  # dims past rot pass through untouched
        assert torch.equal(y[..., rot:], x[..., rot:])


def test_argument_errors():
    x = torch.zeros(2, 1, 3, 8)
    cos, sin = rope_cs(torch.zeros(2, 1), 1e4, 4)
    with pytest.raises(ValueError, match="rot: expected an even number"):
        rope_norm(x, cos, sin, 3)
    with pytest.raises(ValueError, match="cos: expected float32"):
        rope_norm(x, cos[..., :1], sin, 4)
    with pytest.raises(ValueError, match="weight: expected shape"):
        rope_norm(x, cos, sin, 4, torch.ones(7))
    with pytest.raises(ValueError, match="x: expected"):
        rope_norm(x.long(), cos, sin, 4)
