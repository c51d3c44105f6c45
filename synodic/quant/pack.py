"""Bit packing of sub-byte codes along the last dim (what a kernel reads from memory)."""

from __future__ import annotations

import torch


def pack_uint4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, even index in the low nibble (OCP / torchao layout).

    No masking, like torchao's pack_uint4, so the bytes match it even for out-of-range codes."""
    c = codes.view(torch.uint8) if codes.dtype == torch.int8 else codes.to(torch.uint8)
    assert c.shape[-1] % 2 == 0, f"last dim {c.shape[-1]} must be even to pack two codes per byte"
    return c[..., ::2] | (c[..., 1::2] << 4)


def unpack_uint4(packed: torch.Tensor) -> torch.Tensor:
    out = torch.stack([packed & 0xF, packed >> 4], dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Signed 4-bit codes (two's complement nibbles), same layout as pack_uint4."""
    return pack_uint4(codes.to(torch.int16).bitwise_and(0xF).to(torch.uint8))


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    u = unpack_uint4(packed).to(torch.int8)
    return torch.where(u >= 8, u - 16, u)


def pack_uint6(codes: torch.Tensor) -> torch.Tensor:
    """Four 6-bit codes in three bytes, little-endian bit order (code i at bits 6i..6i+5)."""
    assert codes.shape[-1] % 4 == 0, f"last dim {codes.shape[-1]} must be a multiple of 4 to pack 6-bit codes"
    c = (codes.to(torch.int32) & 0x3F).reshape(*codes.shape[:-1], -1, 4)
    word = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
    out = torch.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], dim=-1)
    return out.to(torch.uint8).reshape(*codes.shape[:-1], -1)


def unpack_uint6(packed: torch.Tensor) -> torch.Tensor:
    b = packed.to(torch.int32).reshape(*packed.shape[:-1], -1, 3)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    out = torch.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], dim=-1)
    return out.to(torch.uint8).reshape(*packed.shape[:-1], -1)
