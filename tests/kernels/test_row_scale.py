"""row_scale: Triton kernel vs torch reference, bit for bit (one fp32 product, one rounding) over odd widths, row
counts around the row block, strided rows and every dtype; argument errors; QuantLinear's dense path uses it."""
import pytest
import torch
from synodic.kernels.row_scale import row_scale, row_scale_ref


@pytest.mark.parametrize("shape,dtype", [((3, 37), torch.float32), ((5, 1100), torch.bfloat16),
                                         ((1, 8), torch.bfloat16), ((2, 3, 2049), torch.float16),
                                         ((9, 130), torch.bfloat16)])
def test_triton_matches_ref_bit_for_bit(shape, dtype, device):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=gen) * 5).to(dtype).to(device)
    s = torch.rand(shape[-1], generator=gen).add(0.25).mul(4).to(device)
    y = row_scale(x, s, backend="triton")
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, row_scale_ref(x, s))


def test_strided_rows(device):
    gen = torch.Generator().manual_seed(3)
    proj = torch.randn(6, 2 * 300, generator=gen).to(torch.bfloat16).to(device)
    x, s = proj[:, 300:], torch.rand(300, generator=gen).to(device)
    assert torch.equal(row_scale(x, s, backend="triton"), row_scale_ref(x.contiguous(), s))


def test_argument_errors():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="s: expected shape"):
        row_scale(x, torch.ones(7))
    with pytest.raises(ValueError, match="s: expected float32"):
        row_scale(x, torch.ones(8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x: expected"):
        row_scale(x.long(), torch.ones(8))


def test_dense_path_multiplier_is_the_kernel(monkeypatch):
    """The dense path's multiplier (QuantLinear's scale_rows) runs row_scale on GPU tensors (the GPU check is
    patched so that the dispatch is checked on the CPU), with the same bits as the three-op form."""
    from synodic.quant import linear as lin
    seen = []
    real = lin.row_scale

    def spy(x, s, **k):
        seen.append(x.shape)
        return real(x, s, backend="ref")
    monkeypatch.setattr(lin, "row_scale", spy)
    monkeypatch.setattr(lin, "_on_gpu", lambda x: True)
    x, s = torch.randn(4, 16).to(torch.bfloat16), torch.rand(16)
    assert torch.equal(lin.scale_rows(x, s), (x.float() * s).to(torch.bfloat16)) and seen == [(4, 16)]
