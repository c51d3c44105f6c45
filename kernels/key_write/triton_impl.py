"""Triton `write_keys_fp8`: one program per key row: load, absolute max, scale, IEEE-rounded divide, fp8 code
(round to nearest even), both stores. Bitwise equal to the reference: the scale is a multiply by the fp32
reciprocal as there, the divide is `div_rn` (Triton's plain `/` on fp32 is an approximate divide), and the fp8
code is built from the fp32 bits (`_e4m3_code`), the same on the GPU and in the interpreter (whose own fp8 cast
does not round to nearest even)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ref import FP8_MAX


@triton.jit
def _e4m3_code(x):
    """fp32 x, |x| <= 448 -> float8_e4m3fn bits (int32), round to nearest even: normals keep 3 mantissa bits of
    the fp32 pattern (rounded) with the exponent rebiased 127 -> 7; below 2^-6 the code is |x| / 2^-9 rounded to
    an integer (8 = the smallest normal, the same code)."""
    b = x.to(tl.int32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    normal = (a + 0x7FFFF + ((a >> 20) & 1)) >> 20          # (fp32 exponent << 3 | 3 mantissa bits), rounded
    sub = (a.to(tl.float32, bitcast=True) * 512.0 + 8388608.0) - 8388608.0   # rint by the fp32 add
    code = tl.where(a >= 0x3C800000, normal - (120 << 3), sub.to(tl.int32))  # 0x3C800000 = 2^-6
    return sign | code


@triton.jit
def _write_keys_kernel(k_ptr, keys_ptr, scales_ptr, page_ptr, off_ptr, stride_k, BS, D,
                       FP8_MAX: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    x = tl.load(k_ptr + m.to(tl.int64) * stride_k + d, mask=md, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(amax * (1.0 / FP8_MAX), 1e-12)
    q = _e4m3_code(tl.math.div_rn(x, scale)).to(tl.uint8)
    row = tl.load(page_ptr + m).to(tl.int64) * BS + tl.load(off_ptr + m).to(tl.int64)
    tl.store(keys_ptr + row * D + d, q, mask=md)
    tl.store(scales_ptr + row, scale)


def write_keys_fp8_triton(keys: torch.Tensor, scales: torch.Tensor, page: torch.Tensor, off: torch.Tensor,
                          k: torch.Tensor) -> None:
    M, D = k.shape
    if M == 0:
        return
    _write_keys_kernel[(M,)](k, keys.view(torch.uint8), scales, page, off, k.stride(0), keys.shape[1], D,
                             FP8_MAX=FP8_MAX, BLOCK_D=triton.next_power_of_2(D), num_warps=1)
