"""OCP MX block conversion (E8M0 shared scale), bit-exact to torchao 0.18 `to_mx` / `to_dtype`.

Scale rules (for a block with absolute max `amax`, element type with largest exponent `emax` and
largest value `max`):
- 'floor' (OCP spec, torchao's to_mx default): scale = 2^(floor(log2 amax) - emax); values in
  (max, 2^(emax+1)) saturate to ±max.
- 'rceil' (torchao/TransformerEngine/cuBLAS inference default): scale = 2^ceil(log2(amax/max)),
  computed like torchao's eager path (fp32 division, torch.log2, ceil), which is what the tests match.
- 'rceil_exact': same rule with an exact ceil from the fp32 bits, as Blackwell's cvt.rp.ue8m0 does;
  differs from 'rceil' only when amax/max sits a few ulps above a power of two, where fp32 log2
  rounds to the integer.
"""

from __future__ import annotations

import torch

from synodic.quant.elements import FloatElem, IntElem

SCALE_RULES = ("floor", "rceil", "rceil_exact")
E8M0_NAN = 255
_MIN_NORMAL = 2.0**-126


def _check_rule(rule: str) -> None:
    if rule not in SCALE_RULES:
        raise ValueError(f"unknown MX scale rule {rule!r}; expected one of: {', '.join(SCALE_RULES)}")


def e8m0_to_fp32(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 code -> 2^(code-127) in fp32 (code 0 is the fp32 subnormal 2^-127), 255 -> NaN."""
    s = scale.to(torch.int32)
    val = torch.where(s == 0, 2.0**-127, (s << 23).view(torch.float32))
    return torch.where(s == E8M0_NAN, float("nan"), val)


def mx_scale_data(
    x: torch.Tensor, elem: FloatElem | IntElem, block: int = 32, rule: str = "floor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (E8M0 scale (..., K/block, 1) uint8, x scaled into element units (..., K/block, block))."""
    _check_rule(rule)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    if rule == "floor":
        biased = _floor_exponent(amax, elem)
        # torchao divides by max(scale, 2^-126) while it stores code 0 (2^-127): an all-tiny block
        # (amax < 2^(emax-125)) round-trips to half its value. Kept for bit-exactness; harmless.
        return biased, xb / (biased.to(torch.int32) << 23).view(torch.float32).clamp(min=_MIN_NORMAL)
    return _rceil(xb, amax, elem, exact=rule == "rceil_exact")


def mx_encode(
    x: torch.Tensor, elem: FloatElem | IntElem, block: int = 32, rule: str = "floor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (codes (..., K) unpacked, scale (..., K/block) uint8 E8M0)."""
    biased, data = mx_scale_data(x, elem, block, rule)
    return elem.encode(data).reshape(x.shape), biased.squeeze(-1)


def mx_fake(x: torch.Tensor, elem: FloatElem | IntElem, block: int = 32, rule: str = "floor") -> torch.Tensor:
    """mx_decode(*mx_encode(x)) without materialising codes (fp32)."""
    biased, data = mx_scale_data(x, elem, block, rule)
    return (elem.round(data) * e8m0_to_fp32(biased)).reshape(x.shape)


def _floor_exponent(amax: torch.Tensor, elem) -> torch.Tensor:
    pow2 = ((amax.view(torch.int32) >> 23) & 0xFF) - 127  # floor(log2 amax) for normal amax
    biased = (pow2 - elem.emax).clamp(-127, 128) + 127  # 255 (NaN) only on overflow, like torchao
    return torch.where(torch.isnan(amax), E8M0_NAN, biased).to(torch.uint8)


def _rceil(xb, amax, elem, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    descale = amax / elem.max
    if exact:
        b = descale.view(torch.int32)
        up = ((b & 0x7FFFFF) != 0) & (((b >> 23) & 0xFF) != 0)  # mantissa bits -> round up; subnormals -> 0
        e = (((b >> 23) & 0xFF) - 127 + up.to(torch.int32)).clamp(-127, 127).float()
    else:
        e = torch.ceil(torch.log2(descale)).clamp(-127, 127)
    biased = torch.where(
        torch.isnan(descale), E8M0_NAN, torch.where(torch.isinf(descale), 254, (e + 127).to(torch.uint8))
    ).to(torch.uint8)
    # Reciprocal exactly as torchao/TE: NaN stays NaN, Inf -> 2^-127, code 0 -> 1.0 (not 2^127).
    rcp = torch.where(
        biased == E8M0_NAN,
        descale,
        torch.where(
            biased == 254,
            2.0**-127,
            torch.where(biased == 0, 1.0, torch.exp2(127 - biased.to(torch.float32))),
        ),
    )
    return biased, torch.clamp(xb * rcp, -elem.max, elem.max)


def mx_decode(codes: torch.Tensor, scale: torch.Tensor, elem: FloatElem | IntElem, block: int = 32) -> torch.Tensor:
    """(codes (..., K), E8M0 scale (..., K/block)) -> fp32 values (..., K)."""
    v = elem.decode(codes).reshape(*codes.shape[:-1], -1, block)
    return (v * e8m0_to_fp32(scale).unsqueeze(-1)).reshape(codes.shape)
