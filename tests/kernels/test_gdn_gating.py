"""gdn_gating: Triton kernel vs torch reference (odd head counts, row-strided views of one projection,
bf16 / fp32, softplus past its threshold), argument errors."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.gdn_gating import gdn_gating


# the interpreter evaluates both branches of _softplus' where (0/0 where exp(v) underflows)
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("lead,HV,dtype", [((3, 1), 4, torch.bfloat16), ((2, 5), 7, torch.float32),
                                           ((70,), 32, torch.bfloat16), ((1, 3), 48, torch.float32)])
def test_triton_matches_ref(lead, HV, dtype, device):
    gen = torch.Generator().manual_seed(HV)
    ba = (torch.randn(*lead, 2 * HV, generator=gen) * 8).to(dtype).to(device)  # some a + dt_bias > 20
    b, a = ba.chunk(2, dim=-1)
    A_log = torch.log(torch.rand(HV, generator=gen) * 15 + 1).to(dtype).to(device)
    dt_bias = torch.randn(HV, generator=gen).to(dtype).to(device)
    g, beta = gdn_gating(a, b, A_log, dt_bias, backend="triton")
    g_ref, beta_ref = gdn_gating(a, b, A_log, dt_bias, backend="ref")
    assert g.dtype == beta.dtype == torch.float32 and g.shape == beta.shape == a.shape
    assert rel_max(g, g_ref) < 1e-5 and rel_max(beta, beta_ref) < 1e-5


def test_argument_errors():
    a = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="a/b"):
        gdn_gating(a, a[:, :3], torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="dt_bias: expected shape"):
        gdn_gating(a, a, torch.zeros(4), torch.zeros(5))
    with pytest.raises(ValueError, match="backend"):
        gdn_gating(a, a, torch.zeros(4), torch.zeros(4), backend="x")
