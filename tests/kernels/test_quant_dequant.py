"""quant_dequant: the Triton dequantizer vs the torch reference (synodic.quant.dequantize, rounded once), bit for
bit, on odd shapes (rows not a multiple of the tile, K an odd multiple of the block, byte columns past a tile), fresh
random weights and hand-made codes covering every element and scale code (zeros, signs, NaN / Inf codes)."""
import pytest
import torch
from synodic.kernels.quant_dequant import DEQUANT_FORMATS, dequant, dequant_ref

from synodic.quant import QTensor, quantize


def _same(a, b):
    """Equal bit patterns where not NaN, NaN where NaN."""
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    return torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b))


@pytest.mark.parametrize("fmt", DEQUANT_FORMATS)
@pytest.mark.parametrize("N,K,dtype", [(19, 96, torch.float32), (5, 544, torch.bfloat16), (33, 160, torch.float16)])
def test_matches_ref_on_random_weights(fmt, N, K, dtype, device):
    gen = torch.Generator().manual_seed(N * K)
    w = torch.randn(N, K, generator=gen) * torch.exp(2 * torch.randn(K, generator=gen))
    q = quantize(w.to(device), fmt)
    got = dequant(q, dtype, backend="triton")
    assert got.shape == (N, K) and got.dtype == dtype
    assert _same(got.cpu(), dequant_ref(q, dtype).cpu())


@pytest.mark.parametrize("fmt", DEQUANT_FORMATS)
def test_every_code_and_scale(fmt, device):
    """All 256 byte values against every scale code the format has (E8M0 0..255 incl. NaN; E4M3 0..255)."""
    packed = fmt in ("mxfp4", "nvfp4")
    block = 16 if fmt == "nvfp4" else 32
    nbytes_block = block // 2 if packed else block
    codes = torch.arange(256, dtype=torch.uint8)
    data = codes.repeat(256, 1)  # row r: every byte value, its blocks all with scale code r
    scale = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 256 // nbytes_block)
    ts = torch.tensor(0.37, dtype=torch.float32) if fmt == "nvfp4" else None
    K = 512 if packed else 256
    q = QTensor(fmt, data.to(device), scale.to(device), None if ts is None else ts.to(device), (256, K))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert _same(dequant(q, dtype, backend="triton").cpu(), dequant_ref(q, dtype).cpu())


def test_auto_takes_ref_for_other_formats():
    w = torch.randn(8, 64)
    q = quantize(w, "mxfp6_e2m3")
    assert torch.equal(dequant(q, torch.float32), dequant_ref(q, torch.float32))
    with pytest.raises(ValueError, match="dequant kernel reads"):
        dequant(q, torch.float32, backend="triton")


def test_bad_input_errors():
    q = quantize(torch.randn(8, 64), "mxfp4")
    with pytest.raises(ValueError, match="dtype: expected float32, bfloat16 or float16, got torch.int8"):
        dequant(q, torch.int8)
    with pytest.raises(ValueError, match="backend: expected"):
        dequant(q, torch.float32, backend="cuda")
