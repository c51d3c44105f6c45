"""The packed GEMM's weight layout ("gemm" kernel, gemm.py): the stored QTensor codes permuted once, at load.

The checkpoint keeps the QTensor layout (codes [N, K/2] or [N, K] uint8, even k in the low nibble). The GEMM
reads code bytes in units of 64 bytes per row (UNIT_CODES: 128 4-bit or 64 8-bit codes) in which

    byte j = 16 t + 4 c + 2 h + p    (t, c in 0..3; h, p in 0..1)

holds the code of unit-local k = kappa = 16 c + 8 h + 2 t + p: the k the tensor-core A operand hands quad lane t
at k16 step c (pairs p, the +8 half h). So one thread's operand registers are 16 consecutive bytes (one vector
load) and the kernel needs no shuffle of the bytes it loaded, only a logical permute (`gemm._uperm`). For 4-bit
codes the low nibble of byte j is unit-local k = kappa and the high nibble k = 64 + kappa: the two nibble planes
feed two dots whose activations are the unit's two contiguous halves (plain vector loads of x, no even / odd
split). K is padded with zero codes to a multiple of the unit, the block scales with a neutral code (1.0); a
launch takes the largest power-of-two tile up to its BLOCK_K that divides the padded K, so the weights need no K
masks (the presets' K are multiples of 512: every tile).

Same bytes as the QTensor (plus the padding); `unrepack` inverts it (tests, and any path that needs the stored
layout back).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

UNIT_BYTES = 64
MAX_BLOCK_K = 512  # the largest BLOCK_K a config may ask for
GEMM_FORMATS = ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")
_ONE = {"mx": 127, "nvfp4": 0x38}  # the scale code of 1.0: E8M0 2^0, E4M3 1.0


def unit_codes(fmt: str) -> int:
    """Codes per 64-byte unit of a row: 128 for 4-bit formats, 64 for 8-bit."""
    return 128 if fmt in ("mxfp4", "nvfp4") else 64


@dataclass
class GemmWeight:
    """A weight in the GEMM layout: data [N, KP/2] (4-bit) or [N, KP] (8-bit) uint8, scale [N, KP/B] uint8 (the
    QTensor's codes, padded), NVFP4's fp32 tensor scale; K the true reduction length, KP its padded length."""

    fmt: str
    data: torch.Tensor
    scale: torch.Tensor
    tensor_scale: torch.Tensor | None
    N: int
    K: int
    KP: int
    block: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    def nbytes(self) -> int:
        ts = 0 if self.tensor_scale is None else self.tensor_scale.numel() * 4
        return self.data.numel() + self.scale.numel() + ts


def _perm_dims(packed: bool) -> tuple[int, ...]:
    # codes viewed [N, U, (half,) c, h, t, p] -> bytes [N, U, (half,) t, c, h, p]
    return (0, 1, 2, 5, 3, 4, 6) if packed else (0, 1, 4, 2, 3, 5)


def check_weight(q, formats: tuple[str, ...], layout: str) -> None:
    """q: a 2-D (N, K) QTensor in one of the formats a layout (this GEMM's, kmajor's) holds; `layout` words the
    error ("the packed GEMM reads")."""
    if q.fmt not in formats:
        raise ValueError(f"q.fmt={q.fmt!r}: {layout} {', '.join(formats)}")
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D (N, K) weight, got shape {q.shape}")


def padded_codes(q, KP: int) -> torch.Tensor:
    """uint8 [N, KP]: q's element codes, one a byte (4-bit ones unpacked), zero codes past K."""
    codes = q.codes() if q.fmt in ("mxfp4", "nvfp4") else q.data
    return torch.nn.functional.pad(codes.to(torch.uint8), (0, KP - q.shape[1]))


def padded_scale(q, KP: int) -> torch.Tensor:
    """q's block scale codes [N, KP / block], the blocks past K at scale 1.0 (their codes are zero)."""
    return torch.nn.functional.pad(q.scale, (0, KP // q.spec.block - q.scale.shape[1]), value=_ONE[q.spec.family])


def repack(q) -> GemmWeight:
    """QTensor (a GEMM_FORMATS format) -> GemmWeight, on q's device (one pass of torch ops over the codes)."""
    check_weight(q, GEMM_FORMATS, "the packed GEMM reads")
    N, K = q.shape
    packed = q.fmt in ("mxfp4", "nvfp4")
    block = q.spec.block
    KP = -(-K // unit_codes(q.fmt)) * unit_codes(q.fmt)
    codes = padded_codes(q, KP)
    U = KP // unit_codes(q.fmt)
    if packed:  # [N, U, half, c, h, t, p]: k = 128 u + 64 half + 16 c + 8 h + 2 t + p
        v = codes.reshape(N, U, 2, 4, 2, 4, 2).permute(*_perm_dims(True)).reshape(N, U, 2, UNIT_BYTES)
        data = v[:, :, 0] | (v[:, :, 1] << 4)
    else:
        data = codes.reshape(N, U, 4, 2, 4, 2).permute(*_perm_dims(False))
    scale = padded_scale(q, KP)
    return GemmWeight(q.fmt, data.reshape(N, -1).contiguous(), scale.contiguous(), q.tensor_scale, N, K, KP, block)


def unrepack(g: GemmWeight):
    """GemmWeight -> the QTensor it came from (padding dropped)."""
    from synodic.quant.pack import pack_uint4
    from synodic.quant.qtensor import QTensor
    packed = g.fmt in ("mxfp4", "nvfp4")
    U = g.KP // unit_codes(g.fmt)
    if packed:
        b = g.data.reshape(g.N, U, 1, 4, 4, 2, 2)  # [N, U, 1, t, c, h, p]
        v = torch.cat([b & 0xF, b >> 4], dim=2)  # [N, U, half, t, c, h, p]
        codes = v.permute(0, 1, 2, 4, 5, 3, 6).reshape(g.N, g.KP)  # back to [.., c, h, t, p]
        data = pack_uint4(codes[:, :g.K])
    else:
        v = g.data.reshape(g.N, U, 4, 4, 2, 2)  # [N, U, t, c, h, p]
        data = v.permute(0, 1, 3, 4, 2, 5).reshape(g.N, g.KP)[:, :g.K]
    return QTensor(g.fmt, data.contiguous(), g.scale[:, :g.K // g.block].contiguous(), g.tensor_scale, (g.N, g.K))
