"""Formats: bit-exact against torchao 0.18 (to_mx FLOOR/RCEIL, nvfp4_quantize), plus self-checks."""

import itertools
import math

import pytest
import torch

from synodic.quant import FORMATS, dequantize, fake_quant, quantize
from synodic.quant.elements import E2M1, E2M3, E3M2, E4M3, E5M2, INT8_MX
from synodic.quant.mx import mx_decode, mx_encode
from synodic.quant.nvfp4 import nvfp4_decode, nvfp4_encode
from synodic.quant.pack import pack_int4, pack_uint4, pack_uint6, unpack_int4, unpack_uint4, unpack_uint6

try:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    TORCHAO_ERR = None
except Exception as e:  # noqa: BLE001 - any import failure means "no reference"
    TORCHAO_ERR = f"{type(e).__name__}: {e}"

needs_torchao = pytest.mark.skipif(
    TORCHAO_ERR is not None,
    reason=f"torchao 0.18 (the bit-exact reference) not importable ({TORCHAO_ERR}); "
    "install it with: .venv/bin/python -m pip install 'torchao==0.18.*'",
)

MX = {  # format -> (element, torchao elem dtype name)
    "mxfp4": (E2M1, "float4_e2m1fn_x2"),
    "mxfp6_e2m3": (E2M3, "fp6_e2m3"),
    "mxfp6_e3m2": (E3M2, "fp6_e3m2"),
    "mxfp8_e4m3": (E4M3, "float8_e4m3fn"),
    "mxfp8_e5m2": (E5M2, "float8_e5m2"),
}


def _ao_dtype(name):
    return {"fp6_e2m3": DTYPE_FP6_E2M3, "fp6_e3m2": DTYPE_FP6_E3M2}.get(name) or getattr(torch, name)


def _grid(elem) -> list[float]:
    """Positive grid values of an element type."""
    vals = elem.decode(torch.arange(2 ** (elem.bits - 1), dtype=torch.uint8))
    return sorted(v for v in vals.tolist() if math.isfinite(v))


def _tie_blocks(elem, block: int) -> torch.Tensor:
    """Blocks whose first element is max*2^e (so the scale is exactly 2^e under every rule) followed by
    exact midpoints of the grid (round-half-even ties) and values in (max, 2^(emax+1))*2^e."""
    g = _grid(elem)
    mids = [(a + b) / 2 for a, b in itertools.pairwise(g)]
    over = [elem.max + (2 ** (elem.emax + 1) - elem.max) * f for f in (0.25, 0.5, 0.75, 0.999)]
    body = [s * v for v in mids + over for s in (1, -1)]
    rows = []
    for e in (-30, -8, -3, 0, 3, 9, 30):
        for i in range(0, len(body), block - 1):
            chunk = body[i : i + block - 1]
            chunk = chunk + [0.0] * (block - 1 - len(chunk))
            rows.append([elem.max * 2.0**e] + [v * 2.0**e for v in chunk])
    return torch.tensor(rows, dtype=torch.float32).reshape(-1)


def _corner_blocks(block: int) -> torch.Tensor:
    nan, inf, sub = float("nan"), float("inf"), 2.0**-140
    g = torch.Generator().manual_seed(1)
    r = torch.randn(block, generator=g)
    blocks = [
        torch.zeros(block),
        torch.full((block,), -0.0),
        torch.tensor([0.0, -0.0] * (block // 2)),
        r * sub,  # all fp32 subnormals
        torch.cat([r[:-1] * sub, torch.tensor([1.0])]),  # subnormals beside a normal
        r * 2.0**-124,  # tiny normal block (E8M0 code 0/1 region)
        torch.where(torch.arange(block) == 3, nan, r),
        torch.where(torch.arange(block) == 5, inf, r),
        torch.where(torch.arange(block) == 0, -inf, r),
        torch.where(torch.arange(block) < 2, torch.tensor([nan, inf]).repeat(block // 2), r),
        r * 1e38,  # near fp32 max
    ]
    return torch.cat(blocks)


def _values(elem, block: int, n: int = 1 << 20) -> torch.Tensor:
    """>= 1e6 random values over many magnitudes (blocks mixing them, too) + the corner cases, as (rows, 1024)."""
    g = torch.Generator().manual_seed(0)
    mags = torch.tensor([1e-38, 1e-20, 1e-6, 1e-2, 1.0, 7.0, 1e3, 1e8, 1e30])
    x = torch.randn(n, generator=g) * mags[torch.randint(0, len(mags), (n // block,), generator=g)].repeat_interleave(
        block
    )
    x[: n // 4] = x[: n // 4] * mags[torch.randint(0, len(mags), (n // 4,), generator=g)]  # mixed blocks
    parts = [x, _tie_blocks(elem, block), _corner_blocks(block)]
    flat = torch.cat(parts)
    pad = (-flat.numel()) % 1024
    return torch.cat([flat, torch.zeros(pad)]).reshape(-1, 1024)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit as values; NaN equals NaN (dequantized NaN payloads are not part of the format)."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all()) and bool(
        (torch.signbit(a) == torch.signbit(b))[a == 0].all()
    )


# --------------------------------------------------------------------------------------- torchao


@needs_torchao
@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", list(MX))
def test_mx_bit_exact_vs_torchao(fmt, rule):
    elem, ao_name = MX[fmt]
    x = _values(elem, 32)
    mode = ScaleCalculationMode.FLOOR if rule == "floor" else ScaleCalculationMode.RCEIL
    ao_scale, ao_data = to_mx(x, _ao_dtype(ao_name), 32, mode)
    q = quantize(x, fmt, rule=rule)
    assert torch.equal(q.scale, ao_scale.view(torch.uint8).reshape(q.scale.shape))
    assert torch.equal(q.codes() if elem.bits == 6 else q.data, ao_data.view(torch.uint8))  # torchao keeps fp6 unpacked
    ref = to_dtype(ao_data, ao_scale, _ao_dtype(ao_name), 32, torch.float32)
    assert _same(dequantize(q), ref)


@needs_torchao
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_mx_bf16_input_vs_torchao(fmt):
    elem, ao_name = MX[fmt]
    x = _values(elem, 32, n=1 << 16).to(torch.bfloat16)
    ao_scale, ao_data = to_mx(x, _ao_dtype(ao_name), 32, ScaleCalculationMode.FLOOR)
    q = quantize(x, fmt)
    assert torch.equal(q.scale, ao_scale.view(torch.uint8).reshape(q.scale.shape))
    assert torch.equal(q.data, ao_data.view(torch.uint8))


@needs_torchao
@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_bit_exact_vs_torchao(two_level):
    x = _values(E2M1, 16)
    finite = x.isfinite().all(-1)  # a NaN/Inf anywhere poisons the per-tensor amax: test those rows apart
    for rows in (x[finite], x[~finite]):
        p = per_tensor_amax_to_scale(rows.abs().amax()) if two_level else None
        ao_scale, ao_data = nvfp4_quantize(rows, 16, p)
        codes, scale = nvfp4_encode(rows, p)
        assert torch.equal(scale, ao_scale.view(torch.uint8))
        assert torch.equal(pack_uint4(codes), ao_data)
        # torchao's NVFP4Tensor.dequantize: unpacked e2m1 * (p * block scale)
        s = ao_scale.float() if p is None else p * ao_scale.float()
        ref = E2M1.decode(unpack_uint4(ao_data)).reshape(*rows.shape[:-1], -1, 16) * s.unsqueeze(-1)
        assert _same(nvfp4_decode(codes, scale, p), ref.reshape(rows.shape))


@needs_torchao
def test_nvfp4_api_tensor_scale_matches_torchao():
    x = torch.randn(64, 256) * torch.logspace(-3, 3, 256)
    q = quantize(x, "nvfp4")  # per-tensor scale from amax(x)
    ao_scale, ao_data = nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().amax()))
    assert torch.equal(q.data, ao_data) and torch.equal(q.scale, ao_scale.view(torch.uint8))
    q1 = quantize(x, "nvfp4", tensor_scale=None)
    ao_scale1, ao_data1 = nvfp4_quantize(x, 16, None)
    assert torch.equal(q1.data, ao_data1) and torch.equal(q1.scale, ao_scale1.view(torch.uint8))


# ----------------------------------------------------------------------------------- self-checks


def test_e2m1_grid_and_pack_layout():
    assert _grid(E2M1) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    codes = E2M1.encode(torch.tensor([0.5, 6.0, -1.0, 0.25, 0.75, 5.0, 100.0, -0.0]))
    assert codes.tolist() == [1, 7, 10, 0, 2, 6, 7, 8]  # ties to even: 0.25->0, 0.75->1, 5->4
    assert pack_uint4(codes).tolist() == [0x71, 0x0A, 0x62, 0x87]  # even index in the low nibble


def test_pack_round_trips():
    g = torch.Generator().manual_seed(0)
    u4 = torch.randint(0, 16, (3, 64), generator=g, dtype=torch.uint8)
    i4 = torch.randint(-8, 8, (3, 64), generator=g).to(torch.int8)
    u6 = torch.randint(0, 64, (3, 64), generator=g, dtype=torch.uint8)
    assert torch.equal(unpack_uint4(pack_uint4(u4)), u4)
    assert torch.equal(unpack_int4(pack_int4(i4)), i4)
    assert pack_uint6(u6).shape == (3, 48) and torch.equal(unpack_uint6(pack_uint6(u6)), u6)


def _mxint8_reference(x: torch.Tensor) -> torch.Tensor:
    """OCP spec, scalar python: X = 2^(floor(log2 amax) - 0), element = RNE(v/X * 64) clamped to ±127."""
    out = []
    for blk in x.reshape(-1, 32).tolist():
        amax = max(abs(v) for v in blk)
        e = max(math.frexp(amax)[1] - 1, -127) if amax > 0 else -127
        out += [max(-127, min(127, round(v / 2.0**e * 64))) / 64 * 2.0**e for v in blk]
    return torch.tensor(out).reshape(x.shape)


def test_mxint8_matches_spec_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-8, 8, 256)
    x[0, :32] = 0.0
    x[1, :32] = torch.tensor([1.0, 127 / 64 + 1 / 256] + [(k + 0.5) / 64 for k in range(30)])  # ties, saturation
    assert torch.equal(fake_quant(x, "mxint8"), _mxint8_reference(x))
    codes, scale = mx_encode(x, INT8_MX, 32)
    assert codes.dtype == torch.int8 and codes.abs().max() <= 127
    assert torch.equal(mx_decode(codes, scale, INT8_MX, 32), fake_quant(x, "mxint8"))


def test_int4_g64_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g) * torch.logspace(-3, 3, 256)
    x[0, :64] = 0.0
    q = quantize(x, "int4_g64")
    xb = x.reshape(32, 4, 64)
    s = xb.abs().amax(-1, keepdim=True) / 7
    ref = (torch.round(xb / torch.where(s == 0, 1, s)).clamp(-7, 7) * s).reshape(x.shape)
    assert torch.equal(dequantize(q), ref)
    assert q.data.numel() == x.numel() // 2 and q.codes().abs().max() <= 7


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fake_quant_properties(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 128, generator=g) * 3
    y = fake_quant(x, fmt)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(fake_quant(y, fmt), y)  # idempotent: grid points are fixed points
    assert torch.equal(fake_quant(torch.zeros(2, 128), fmt), torch.zeros(2, 128))
    assert torch.equal(fake_quant(2 * x, fmt), 2 * y)  # power-of-two scaling commutes exactly
    rel = ((y - x).norm() / x.norm()).item()
    tol = {"mxfp4": 0.15, "mxfp6_e2m3": 0.035, "mxfp6_e3m2": 0.07, "mxfp8_e4m3": 0.035, "mxfp8_e5m2": 0.07}
    assert rel < {**tol, "mxint8": 0.012, "nvfp4": 0.12, "int4_g64": 0.14}[fmt]
    assert fake_quant(x.bfloat16(), fmt).dtype == torch.bfloat16


def test_storage_bytes():
    x = torch.randn(4, 1024)
    assert quantize(x, "mxfp4").nbytes() == 4 * (512 + 32)
    assert quantize(x, "mxfp6_e2m3").nbytes() == 4 * (768 + 32)
    assert quantize(x, "nvfp4").nbytes() == 4 * (512 + 64) + 4
    assert quantize(x, "int4_g64").nbytes() == 4 * (512 + 16 * 4)


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="unknown quant format 'fp3'; expected one of: mxfp4, .*int4_g64"):
        fake_quant(torch.zeros(32), "fp3")
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        fake_quant(torch.zeros(3, 40), "mxfp4")
    with pytest.raises(ValueError, match="unknown MX scale rule"):
        fake_quant(torch.zeros(32), "mxfp4", rule="ceil")


@pytest.mark.parametrize(
    ("fmt", "rule"),
    [(f, r) for f in FORMATS for r in ("floor", "rceil", "rceil_exact") if FORMATS[f].family == "mx" or r == "floor"],
)
def test_fake_quant_equals_quantize_dequantize(fmt, rule):
    """The code-free fast path gives the stored format's values, corner cases included."""
    spec = FORMATS[fmt]
    elem = spec.elem if spec.family != "int" else E2M1
    x = _values(elem, spec.block, n=1 << 16)
    finite = x.isfinite().all(-1)
    for rows in (x[finite], x):  # NaN/Inf rows apart too: they poison NVFP4's per-tensor amax
        assert _same(fake_quant(rows, fmt, rule=rule), dequantize(quantize(rows, fmt, rule=rule)))


def test_rceil_exact_rounds_up_exactly():
    """rceil_exact = 127 + ceil(log2(amax/max)) in exact arithmetic on the fp32 quotient; 'rceil'
    (torchao eager) can round amax/max that sits a few ulps above a power of two down."""
    k = torch.arange(-100, 100, dtype=torch.float32)
    above = ((torch.exp2(k) * 6.0).view(torch.int32) + 8).view(torch.float32)  # amax/6 just above 2^k
    x = torch.zeros(len(k), 32)
    x[:, 0] = above
    _, exact = mx_encode(x, E2M1, 32, "rceil_exact")
    _, eager = mx_encode(x, E2M1, 32, "rceil")
    want = [127 + math.ceil(math.log2(float(torch.tensor(v) / 6.0)) + 1e-12) for v in above.tolist()]
    assert exact.flatten().tolist() == want
    assert (eager.flatten() <= exact.flatten()).all()
