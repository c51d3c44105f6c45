"""rmsnorm / gated_rmsnorm: Triton kernel vs torch reference (odd widths and group sizes, leading dims,
row-strided inputs, bf16 / fp32); the norm modules equal the reference on the CPU and keep autograd."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.rmsnorm import add_rmsnorm, gated_rmsnorm, gated_rmsnorm_ref, rmsnorm, rmsnorm_ref

from synodic.models.norm import GatedRMSNorm, RMSNorm

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # bf16: a rounding apart where fp32 sums differ


def _inputs(lead, D, dtype, device, gen, strided):
    x = torch.randn(*lead, D, generator=gen) * 3
    if strided:  # a slice of a wider projection output, like the models' gate z
        x = torch.randn(*lead, D + 11, generator=gen)[..., 5:5 + D]
    return x.to(dtype).to(device)


@pytest.mark.parametrize("lead,D,dtype", [((3, 5), 96, torch.float32), ((7,), 1000, torch.bfloat16),
                                          ((2, 1), 4096, torch.bfloat16), ((4,), 33, torch.float32)])
def test_rmsnorm_triton_matches_ref(lead, D, dtype, device):
    gen = torch.Generator().manual_seed(D)
    x = _inputs(lead, D, dtype, device, gen, strided=D == 33)
    w = (torch.rand(D, generator=gen) + 0.5).to(dtype).to(device)
    y = rmsnorm(x, w, 1e-5, backend="triton")
    y_ref = rmsnorm(x, w, 1e-5, backend="ref")
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_max(y, y_ref) < TOL[dtype]


@pytest.mark.parametrize("lead,D,dtype", [((3, 1), 96, torch.float32), ((5,), 1000, torch.bfloat16),
                                          ((2, 1), 4096, torch.bfloat16), ((4,), 33, torch.float32)])
def test_add_rmsnorm_triton_matches_ref(lead, D, dtype, device):
    gen = torch.Generator().manual_seed(D + 1)
    x = _inputs(lead, D, dtype, device, gen, strided=D == 33)
    r = _inputs(lead, D, dtype, device, gen, strided=False)
    w = (torch.rand(D, generator=gen) + 0.5).to(dtype).to(device)
    s, y = add_rmsnorm(x, r, w, 1e-5, backend="triton")
    s_ref, y_ref = add_rmsnorm(x, r, w, 1e-5, backend="ref")
    assert torch.equal(s, s_ref)  # the add rounds once, as torch's does
    assert torch.equal(s_ref, x + r) and s.shape == y.shape == x.shape and y.dtype == dtype
    assert rel_max(y, y_ref) < TOL[dtype]
    assert rel_max(y, rmsnorm(s_ref, w, 1e-5, backend="triton")) == 0  # = the add, then the norm kernel


def test_add_rmsnorm_argument_errors():
    x, w = torch.zeros(2, 8), torch.ones(8)
    with pytest.raises(ValueError, match="residual: expected x's shape"):
        add_rmsnorm(x, torch.zeros(2, 7), w)
    with pytest.raises(ValueError, match="residual: expected x's shape"):
        add_rmsnorm(x, x.double(), w)


@pytest.mark.parametrize("lead,D,gs,dtype", [
    ((3, 2), 96, 96, torch.float32),      # one group
    ((5,), 1000, 250, torch.bfloat16),    # groups not a power of two
    ((2, 3), 448, 64, torch.float32),     # 7 groups in one program
    ((4, 1), 2048, 128, torch.bfloat16),  # GDN-like: many small groups
    ((3,), 8192, 1024, torch.bfloat16),   # Mamba-2-like: two programs per row
])
def test_gated_rmsnorm_triton_matches_ref(lead, D, gs, dtype, device):
    gen = torch.Generator().manual_seed(D + gs)
    x = _inputs(lead, D, dtype, device, gen, strided=False)
    z = _inputs(lead, D, dtype, device, gen, strided=True)
    w = (torch.rand(D, generator=gen) + 0.5).to(dtype).to(device)
    y = gated_rmsnorm(x, z, w, 1e-5, gs, backend="triton")
    y_ref = gated_rmsnorm(x, z, w, 1e-5, gs, backend="ref")
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_max(y, y_ref) < TOL[dtype]


def test_modules_equal_reference_and_keep_autograd():
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(2, 3, 64, generator=gen), torch.randn(2, 3, 64, generator=gen)
    n, gn = RMSNorm(64, 1e-6), GatedRMSNorm(64, 1e-6, group_size=16)
    with torch.no_grad():
        n.weight.uniform_(0.5, 1.5)
        gn.weight.uniform_(0.5, 1.5)
        assert torch.equal(n(x), rmsnorm_ref(x, n.weight, 1e-6))
        assert torch.equal(gn(x, z), gated_rmsnorm_ref(x, z, gn.weight, 1e-6, 16))
    gn(x, z).sum().backward()
    assert gn.weight.grad is not None and torch.isfinite(gn.weight.grad).all()


def test_argument_errors():
    x = torch.zeros(2, 12)
    with pytest.raises(ValueError, match="weight: expected shape"):
        rmsnorm(x, torch.ones(11))
    with pytest.raises(ValueError, match="group_size"):
        gated_rmsnorm(x, x, torch.ones(12), group_size=5)
    with pytest.raises(ValueError, match="z: expected"):
        gated_rmsnorm(x, x[:, :6], torch.ones(12))
    with pytest.raises(ValueError, match="backend"):
        rmsnorm(x, torch.ones(12), backend="gpu")
