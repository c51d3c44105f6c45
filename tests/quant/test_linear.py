"""QuantLinear: forward follows the solve contract in every mode; buffers move with the module."""

import pytest
import torch
from torch import nn

from synodic.quant import QuantLinear, dequantize, fake_quant


@pytest.fixture
def linear() -> nn.Linear:
    torch.manual_seed(0)
    lin = nn.Linear(256, 96)
    with torch.no_grad():
        lin.weight.mul_(torch.exp(torch.randn(256)))  # uneven input channels
    return lin


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("w4a16", "mxfp4"), ("w4a16", "int4_g64"), ("w8a16", "mxint8"), ("w4a4", "nvfp4"), ("w8a8", "mxfp8_e4m3")],
)
@pytest.mark.parametrize("method", ["rtn", "dualquant"])
def test_forward_matches_contract(linear, mode, fmt, method):
    x = torch.randn(5, 7, 256)
    ql = QuantLinear.from_linear(
        linear, mode=mode, fmt=fmt, method=method, **({"iters": 3} if method == "dualquant" else {})
    )
    s = ql.act_scale
    assert (s is None) == (method == "rtn")
    a = x if s is None else x * s
    if mode in ("w4a4", "w8a8"):
        a = fake_quant(a, fmt)
    want = a @ ql.weight_q.T + linear.bias
    torch.testing.assert_close(ql(x), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(dequantize(ql.qtensor()), ql.weight_q)
    y = linear(x).detach()
    assert ((ql(x) - y).norm() / y.norm()).item() < (0.3 if "4" in mode else 0.05)  # a sanity bound


def test_smoothquant_and_bf16(linear):
    x = torch.randn(16, 256)
    ql = QuantLinear.from_linear(linear, mode="w8a8", fmt="mxint8", method="smoothquant", act_absmax=x.abs().amax(0))
    out = ql(x.bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == (16, 96)
    y = linear(x).detach()
    assert ((out.float() - y).norm() / y.norm()).item() < 0.05
    assert "mode=w8a8" in repr(ql) and ql.qtensor().nbytes() == 96 * (256 + 8)


def test_bad_mode_or_format(linear):
    with pytest.raises(ValueError, match="unknown quant mode 'w2a2'; expected one of: w4a16, w8a16, w4a4, w8a8"):
        QuantLinear.from_linear(linear, mode="w2a2")
    with pytest.raises(
        ValueError, match="needs a 4-bit format, got 'mxfp8_e4m3'; expected one of: mxfp4, nvfp4, int4_g64"
    ):
        QuantLinear.from_linear(linear, mode="w4a4", fmt="mxfp8_e4m3")


def test_buffers_follow_module(linear):
    ql = QuantLinear.from_linear(linear, mode="w4a4", fmt="nvfp4", method="dualquant", iters=2)
    names = {n for n, _ in ql.named_buffers()}
    assert {"weight_q", "act_scale", "bias", "qdata", "qscale", "qtensor_scale"} <= names
    ql = ql.to(torch.float64)  # floating buffers cast, packed codes stay uint8
    assert ql.qdata.dtype == torch.uint8 and ql.weight_q.dtype == torch.float64


@pytest.mark.parametrize(("mode", "fmt"), [("w4a16", "mxfp4"), ("w4a4", "nvfp4"), ("w4a16", "int4_g64"),
                                           ("w8a16", "mxfp8_e5m2"), ("w6a16", "mxfp6_e3m2")])
def test_without_dense_copy(linear, mode, fmt):
    """dense=False: no dequantized weight resident (not a buffer, not in the state dict), the packed bytes only;
    the forward decodes the weight per call and gives exactly the dense layer's output."""
    ql = QuantLinear.from_linear(linear, mode=mode, fmt=fmt, method="dualquant", iters=2)
    lean = QuantLinear.from_packed(ql.qtensor(), ql.act_scale, linear.bias, mode=mode, dtype=torch.float32,
                                   dense=False)
    assert lean.weight_q is None and "weight_q" not in lean.state_dict() and "weight_q" in ql.state_dict()
    assert lean.resident_bytes() == lean.packed_bytes() == ql.packed_bytes()
    assert ql.resident_bytes() == ql.packed_bytes() + 96 * 256 * 4
    assert lean.weight_bytes(3) == lean.packed_bytes() + 2 * 96 * 256 * 4  # codes in, dense out and back
    x = torch.randn(5, 7, 256)
    assert torch.equal(lean(x), ql(x))
    assert torch.equal(lean(x.bfloat16()), ql(x.bfloat16()))
    assert "dense=False" in repr(lean)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scale_rows_is_the_fp32_product_rounded_once(dtype):
    """The dense path's activation multiplier in one kernel gives the bits of the three-kernel form."""
    from synodic.quant.linear import scale_rows
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 259, generator=g) * 7).to(dtype)
    s = torch.rand(259, generator=g) * 3 + 0.01
    got = scale_rows(x, s)
    assert got.dtype == dtype and torch.equal(got, (x.float() * s).to(dtype))
