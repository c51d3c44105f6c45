"""NVFP4: E2M1 elements, E4M3 scale per 16, optional FP32 per-tensor scale.

Bit-exact to torchao 0.18 `nvfp4_quantize` (both paths) and NVFP4Tensor.dequantize: the op order
(amax/6, /p, clamp to [2^-6, 448], RNE to E4M3, multiply by (1/p)/s, clamp ±6) fixes the last ulp.
"""

from __future__ import annotations

import torch

from synodic.quant.elements import E2M1, E4M3

BLOCK = 16
E4M3_TINY = 2.0**-6  # smallest normal E4M3; block scales never go subnormal
_TENSOR_DIV = E4M3.max * E2M1.max  # 2688: a block holding the tensor amax gets block scale 448


def per_tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """p = amax / (448 * 6): block scales then use the full E4M3 range."""
    return amax.to(torch.float32) / _TENSOR_DIV


def nvfp4_block_scales(xb: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    """Blocks (..., nb, 16) fp32 -> E4M3 block scale codes (..., nb) uint8."""
    s = xb.abs().amax(-1) / E2M1.max
    if p is not None:
        s = s / p
    return E4M3.encode(torch.clamp(s, min=E4M3_TINY, max=E4M3.max))


def nvfp4_scale_data(xb: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    """Blocks (..., nb, 16) with given E4M3 scale codes (..., nb) -> values in E2M1 units, clamped to ±6."""
    s = E4M3.decode(scale)
    rcp = 1.0 / s if p is None else (1.0 / p) / s
    return torch.clamp(xb * rcp.unsqueeze(-1), -E2M1.max, E2M1.max)


def nvfp4_encode_blocks(xb: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    """Blocks (..., nb, 16) with given E4M3 scale codes (..., nb) -> E2M1 codes (..., nb, 16)."""
    return E2M1.encode(nvfp4_scale_data(xb, scale, p))


def nvfp4_encode(x: torch.Tensor, p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (E2M1 codes (..., K) unpacked, E4M3 scale codes (..., K/16))."""
    xb = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    scale = nvfp4_block_scales(xb, p)
    return nvfp4_encode_blocks(xb, scale, p).reshape(x.shape), scale


def nvfp4_block_scale_fp32(scale: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    s = E4M3.decode(scale)
    return s if p is None else p * s


def nvfp4_decode(codes: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    v = E2M1.decode(codes).reshape(*codes.shape[:-1], -1, BLOCK)
    return (v * nvfp4_block_scale_fp32(scale, p).unsqueeze(-1)).reshape(codes.shape)


def nvfp4_fake(x: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """nvfp4_decode(*nvfp4_encode(x, p), p) without materialising codes (fp32)."""
    xb = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    scale = nvfp4_block_scales(xb, p)
    v = E2M1.round(nvfp4_scale_data(xb, scale, p))
    return (v * nvfp4_block_scale_fp32(scale, p).unsqueeze(-1)).reshape(x.shape)
