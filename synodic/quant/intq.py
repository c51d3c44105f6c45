"""Symmetric integer blocks with an FP32 scale per group (INT4-g64: codes -7..7, scale amax/7)."""

from __future__ import annotations

import torch

from synodic.quant.elements import IntElem


def int_encode_blocks(xb: torch.Tensor, scale: torch.Tensor, elem: IntElem) -> torch.Tensor:
    """Blocks (..., nb, g) with scales (..., nb, 1) -> int8 codes; a zero scale gives code 0."""
    safe = torch.where(scale == 0, 1.0, scale)
    return elem.encode(xb / safe)


def int_encode(x: torch.Tensor, elem: IntElem, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (int8 codes (..., K), fp32 scale (..., K/group))."""
    xb = x.float().reshape(*x.shape[:-1], -1, group)
    scale = xb.abs().amax(-1, keepdim=True) / elem.qmax
    return int_encode_blocks(xb, scale, elem).reshape(x.shape), scale.squeeze(-1)


def int_decode(codes: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    v = codes.to(torch.float32).reshape(*codes.shape[:-1], -1, group)
    return (v * scale.unsqueeze(-1)).reshape(codes.shape)


def int_fake(x: torch.Tensor, elem: IntElem, group: int) -> torch.Tensor:
    """int_decode(*int_encode(x)) without materialising codes (fp32)."""
    xb = x.float().reshape(*x.shape[:-1], -1, group)
    scale = xb.abs().amax(-1, keepdim=True) / elem.qmax
    return (elem.round(xb / torch.where(scale == 0, 1.0, scale)) * scale).reshape(x.shape)
