"""quant_linear: the packed-weight Triton kernel vs the torch reference (dequantize + fp32 matmul) on odd
small shapes (N, K odd multiples of the block), GEMV rows M in {1, 3}, a tl.dot tile (M=17), split K,
the fused s multiply and MXFP4 activation quantizer; QuantLinear's kernel path vs its torch path."""
import pytest
import torch
from synodic.kernels.quant_linear import quant_linear

from synodic.quant import QuantLinear, quantize


def rel_rmse(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def make(N, K, M, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(K, generator=gen))  # uneven columns
    x = torch.randn(M, K, generator=gen).to(dtype).to(device)
    s = (torch.rand(K, generator=gen) + 0.5).to(device)
    b = torch.randn(N, generator=gen).to(device)
    return w.to(device), x, s, b


CASES = [  # fmt, N, K, M, dtype, act_quant, config
    ("mxfp4", 40, 96, 1, torch.float32, None, None),
    ("mxfp4", 24, 160, 3, torch.float32, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 33, 96, 17, torch.bfloat16, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64)),
    ("nvfp4", 40, 112, 1, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=32)),
    ("nvfp4", 24, 160, 3, torch.bfloat16, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp8_e4m3", 24, 96, 3, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=64)),
    ("mxfp8_e5m2", 16, 96, 1, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=32)),
]


@pytest.mark.parametrize("fmt,N,K,M,dtype,act,config", CASES)
def test_triton_matches_ref(fmt, N, K, M, dtype, act, config, device):
    w, x, s, b = make(N, K, M, dtype, device, seed=N * K + M)
    q = quantize(w, fmt)
    y = quant_linear(x, q, s, b, act_quant=act, backend="triton", config=config)
    y_ref = quant_linear(x, q, s, b, act_quant=act, backend="ref")
    assert y.shape == (M, N) and y.dtype == dtype and torch.isfinite(y).all()
    assert rel_rmse(y, y_ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_ref_is_dequantized_matmul():
    w, x, s, b = make(16, 64, 3, torch.float32, "cpu", 0)
    q = quantize(w, "nvfp4")
    from synodic.quant import dequantize, fake_quant
    want = fake_quant(x * s, "mxfp4") @ dequantize(q).T + b
    torch.testing.assert_close(quant_linear(x, q, s, b, act_quant="mxfp4", backend="ref"), want)


@pytest.mark.parametrize("mode,fmt", [("w4a16", "mxfp4"), ("w4a4", "nvfp4")])
def test_quantlinear_kernel_path(mode, fmt, device):
    w, x, _, _ = make(24, 96, 3, torch.float32, device, 7)
    ql = QuantLinear(w, None, mode=mode, fmt=fmt, method="dualquant", iters=2, backend="triton")
    ref = QuantLinear.from_packed(ql.qtensor(), ql.act_scale, None, mode=mode, backend="torch")
    assert ql.uses_kernel(x) and not ref.uses_kernel(x)
    assert rel_rmse(ql(x[None]), ref(x[None])) < 1e-5


def test_bad_input():
    w, x, s, _ = make(16, 64, 1, torch.float32, "cpu", 1)
    q = quantize(w, "mxfp4")
    with pytest.raises(ValueError, match="x: expected last dim K=64"):
        quant_linear(x[:, :32], q)
    with pytest.raises(ValueError, match="act_quant: expected None or 'mxfp4'"):
        quant_linear(x, q, act_quant="nvfp4")
    with pytest.raises(ValueError, match="the kernel reads"):
        quant_linear(x, quantize(w, "int4_g64"), backend="triton")
