"""Quantize / dequantize / fake-quantize any registered format (blocks along the last dim)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from synodic.quant import intq, mx, nvfp4
from synodic.quant.formats import FormatSpec, check_blocks, get_format
from synodic.quant.pack import pack_int4, pack_uint4, pack_uint6, unpack_int4, unpack_uint4, unpack_uint6


@dataclass
class QTensor:
    """A quantized tensor as stored: packed codes + per-block scales (+ NVFP4's per-tensor scale).

    data: fp4/int4 two codes per byte, fp6 four codes per three bytes, fp8/int8 one per byte.
    scale: (..., K/block) — E8M0 codes (mx), E4M3 codes (nvfp4), fp32 (int).
    """

    fmt: str
    data: torch.Tensor
    scale: torch.Tensor
    tensor_scale: torch.Tensor | None
    shape: tuple[int, ...]

    @property
    def spec(self) -> FormatSpec:
        return get_format(self.fmt)

    def codes(self) -> torch.Tensor:
        """Unpacked codes, shape `shape` (uint8 minifloat codes, or int8 integers)."""
        return _unpack(self.data, self.spec)

    def nbytes(self) -> int:
        ts = 0 if self.tensor_scale is None else self.tensor_scale.numel() * 4
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size() + ts


def _pack(codes: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    if spec.elem.bits == 4:
        return pack_int4(codes) if spec.family == "int" else pack_uint4(codes)
    return pack_uint6(codes) if spec.elem.bits == 6 else codes


def _unpack(data: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    if spec.elem.bits == 4:
        return unpack_int4(data) if spec.family == "int" else unpack_uint4(data)
    return unpack_uint6(data) if spec.elem.bits == 6 else data


def quantize(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    rule: str = "floor",
    tensor_scale: str | torch.Tensor | None = "amax",
) -> QTensor:
    """Quantize x (..., K) to `fmt`. `rule`: MX scale rule (floor | rceil | rceil_exact).
    `tensor_scale` (NVFP4 only): 'amax' -> p = amax(x)/2688 (1 if x is all zero), a tensor -> that p,
    None -> single-level scaling."""
    spec = get_format(fmt)
    check_blocks(tuple(x.shape), spec)
    p = None
    if spec.family == "mx":
        codes, scale = mx.mx_encode(x, spec.elem, spec.block, rule)
    elif spec.family == "nvfp4":
        p = _nvfp4_tensor_scale(x, tensor_scale)
        codes, scale = nvfp4.nvfp4_encode(x, p)
    else:
        codes, scale = intq.int_encode(x, spec.elem, spec.block)
    return QTensor(spec.name, _pack(codes, spec), scale, p, tuple(x.shape))


def _nvfp4_tensor_scale(x: torch.Tensor, tensor_scale) -> torch.Tensor | None:
    if isinstance(tensor_scale, str):
        if tensor_scale != "amax":
            raise ValueError(f"tensor_scale must be 'amax', a tensor or None, got {tensor_scale!r}")
        p = nvfp4.per_tensor_scale(x.abs().amax())
        return torch.where(p > 0, p, 1.0)  # all-zero tensor: p = 0 would turn every block into NaN
    return None if tensor_scale is None else tensor_scale.to(torch.float32)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    spec = q.spec
    codes = q.codes()
    if spec.family == "mx":
        out = mx.mx_decode(codes, q.scale, spec.elem, spec.block)
    elif spec.family == "nvfp4":
        out = nvfp4.nvfp4_decode(codes, q.scale, q.tensor_scale)
    else:
        out = intq.int_decode(codes, q.scale, spec.block)
    return out.to(dtype)


def fake_quant(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    rule: str = "floor",
    tensor_scale: str | torch.Tensor | None = "amax",
) -> torch.Tensor:
    """dequantize(quantize(x, fmt, ...)) in x's dtype, computed without codes; equal to it value for
    value (a NaN in a block makes that whole block NaN either way)."""
    spec = get_format(fmt)
    check_blocks(tuple(x.shape), spec)
    if spec.family == "mx":
        out = mx.mx_fake(x, spec.elem, spec.block, rule)
    elif spec.family == "nvfp4":
        out = nvfp4.nvfp4_fake(x, _nvfp4_tensor_scale(x, tensor_scale))
    else:
        out = intq.int_fake(x, spec.elem, spec.block)
    return out.to(x.dtype)
