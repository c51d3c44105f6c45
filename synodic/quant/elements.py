"""Element types of the block formats: fp32 -> code -> fp32, by bit manipulation of fp32.

Every conversion is round-to-nearest-even with saturation to ±max (never to Inf/NaN), subnormals
kept. NaN inputs get the code torchao 0.18 produces (fp8: torch's cast; fp4/fp6: its bit trick),
so the packed bytes match it bit for bit; those codes only ever sit in a block whose scale is NaN.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cache

import torch

_F32_MBITS = 23
_F32_BIAS = 127


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2**e as fp32 for integer e in [-126, 127], built from bits (exact, no pow())."""
    return ((e + _F32_BIAS) << _F32_MBITS).view(torch.float32)


@dataclass(frozen=True)
class FloatElem:
    """A minifloat element (OCP MX / NVFP4). `nan` says how NaN is encoded: 'none' (fp4/fp6 have no
    NaN; torchao's bit trick decides), 'fn' (E4M3fn: S.1111.111), 'ieee' (E5M2: S.11111.11)."""

    name: str
    ebits: int
    mbits: int
    max: float
    nan: str

    @property
    def bias(self) -> int:
        return 2 ** (self.ebits - 1) - 1

    @property
    def emin(self) -> int:  # exponent of the smallest normal
        return 1 - self.bias

    @property
    def emax(self) -> int:  # exponent of the largest normal (the MX spec's emax_elem)
        return math.floor(math.log2(self.max))

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def max_code(self) -> int:
        q = int(self.max * 2.0 ** (self.mbits - self.emax))
        return ((self.emax - self.emin) << self.mbits) + q

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 -> uint8 codes (sign in bit ebits+mbits), RNE, saturating."""
        assert x.dtype == torch.float32
        m, emin = self.mbits, self.emin
        bits = x.view(torch.int32)
        ab = bits & 0x7FFFFFFF
        a = ab.view(torch.float32)
        small = a < self.max  # False for NaN, Inf and values that saturate
        # Exponent of a, floored at emin so that subnormals share the smallest binade's ulp.
        e = ((ab >> _F32_MBITS) - _F32_BIAS).clamp(emin, self.emax)
        # q = a / ulp(e) rounded half-to-even; exact (power-of-two scaling). q == 2**(m+1) (carry
        # into the next binade) still gives the right code because code = (e - emin) << m + q.
        q = torch.round(torch.where(small, a, 0.0) * _pow2(m - e)).to(torch.int32)
        code = torch.where(small, ((e - emin) << m) + q, self.max_code)
        code = torch.where(torch.isnan(x), self._nan_code(ab), code)
        code = code | ((bits < 0).to(torch.int32) << (self.ebits + m))
        return code.to(torch.uint8)

    def _nan_code(self, ab: torch.Tensor) -> torch.Tensor:
        if self.nan in ("fn", "ieee"):  # torch's fp32 -> fp8 cast
            return torch.full_like(ab, 0x7F)
        # torchao's normal-path bit trick applied to a NaN pattern (rebias, round, shift, wrap to 8 bits)
        shift = _F32_MBITS - self.mbits
        odd = (ab >> shift) & 1
        add = ((self.bias - _F32_BIAS) << _F32_MBITS) + (1 << (shift - 1)) - 1
        return ((ab + add + odd) >> shift) & 0xFF

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 codes -> fp32 values."""
        return _lut(self, codes.device)[codes.to(torch.int64) & (2**self.bits - 1)]

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest grid value (RNE, saturating, Inf -> ±max, NaN stays NaN), fp32 -> fp32.

        Same values as decode(encode(x)) for every non-NaN x, in a third of the ops: no codes."""
        a = x.abs()
        e = (a.view(torch.int32) >> _F32_MBITS).clamp_(self.emin + _F32_BIAS, self.emax + _F32_BIAS)
        ulp = ((e - self.mbits) << _F32_MBITS).view(torch.float32)  # 2^(e - m), exact
        return torch.round(a / ulp).mul_(ulp).clamp_(max=self.max).copysign_(x)


@dataclass(frozen=True)
class IntElem:
    """A signed integer element with an implicit scale: value = code * 2**-frac_bits, |code| <= qmax.

    MXINT8 is IntElem(qmax=127, frac_bits=6) (values k/64, max 127/64); INT4 is qmax=7, frac_bits=0.
    """

    name: str
    bits: int
    qmax: int
    frac_bits: int

    @property
    def max(self) -> float:
        return self.qmax / 2.0**self.frac_bits

    @property
    def emax(self) -> int:
        return math.floor(math.log2(self.max))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 -> int8 codes, RNE, saturating; NaN -> 0 (its block scale is NaN)."""
        q = torch.round(x * 2.0**self.frac_bits).clamp(-self.qmax, self.qmax)
        return torch.nan_to_num(q, nan=0.0).to(torch.int8)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.to(torch.float32) * 2.0**-self.frac_bits

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest grid value, saturating; NaN stays NaN."""
        f = 2.0**self.frac_bits
        return torch.round(x * f).clamp_(-self.qmax, self.qmax).div_(f).add_(0.0)  # integers have no -0


@cache
def _lut(elem: FloatElem, device: torch.device) -> torch.Tensor:
    """Value of every code as fp32 bits; NaN codes carry their mantissa as payload, as torch's
    fp8 -> fp32 cast does (the payload decides later bit tricks, so it is part of bit-exactness)."""
    bits = []
    for c in range(2**elem.bits):
        sign = (c >> (elem.ebits + elem.mbits)) & 1
        ef, mant = (c >> elem.mbits) & (2**elem.ebits - 1), c & (2**elem.mbits - 1)
        top = ef == 2**elem.ebits - 1
        if (elem.nan == "fn" and top and mant == 2**elem.mbits - 1) or (elem.nan == "ieee" and top and mant):
            b = 0x7FC00000 | (mant << (_F32_MBITS - elem.mbits))
        elif elem.nan == "ieee" and top:
            b = 0x7F800000
        else:
            v = (
                mant * 2.0 ** (elem.emin - elem.mbits)
                if ef == 0
                else (1 + mant / 2**elem.mbits) * 2.0 ** (ef - elem.bias)
            )
            b = struct.unpack("<I", struct.pack("<f", v))[0]
        bits.append(b | (sign << 31))
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32).to(device)


E2M1 = FloatElem("e2m1", 2, 1, 6.0, "none")
E2M3 = FloatElem("e2m3", 2, 3, 7.5, "none")
E3M2 = FloatElem("e3m2", 3, 2, 28.0, "none")
E4M3 = FloatElem("e4m3", 4, 3, 448.0, "fn")
E5M2 = FloatElem("e5m2", 5, 2, 57344.0, "ieee")
INT8_MX = IntElem("int8", 8, 127, 6)
INT4 = IntElem("int4", 4, 7, 0)
