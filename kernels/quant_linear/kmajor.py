"""The K-major plane layout of the "kgemm" kernel (kgemm.py): the stored QTensor codes repacked once, at load.

The checkpoint keeps the QTensor layout (codes [N, K/2] or [N, K] uint8, even k in the low nibble; block scales
[N, K/B]). kgemm reads

    words  int32 [KP / E, N]   (E = 8 codes per word for 4-bit formats, 4 for 8-bit; N contiguous)
    scales uint8 [KP / B, N]   (the QTensor's scale codes, transposed)

grouped along K in groups of GROUP = E * B codes (B: the format's block, 32 for MX, 16 for NVFP4): word row
g * B + i holds, in its code slot j (nibble j at bits 4j, or byte j at bits 8j), the code of

    k = g * GROUP + j * B + i        (i in 0..B-1, j in 0..E-1)

so slot j of a group's B word rows is one whole scale block (block g * E + j), K-contiguous. The kernel loads a
group's [B, BLOCK_N] words once and gets each slot's plane with one shift and mask: E planes of [B, BLOCK_N]
weights whose k are contiguous runs, each the B operand of its own tl.dot against the x columns [B rows of k]
it covers. No interleave of nibbles back into k order, no reshape or permute of the decoded tile: the permute
that costs the "gemm" kernel its layout conversions is done here, once, by torch. Slots j and j + E/2 sit 16
bits apart, so one 32-bit integer op chain decodes two weights (kgemm._pair).

K is padded with zero codes to a multiple of GROUP (256 codes MXFP4, 128 NVFP4 and MXFP8), the scales with the
neutral code (1.0); the presets' K (2560, 4096, 14336, ...) need no padding. Same bytes as the QTensor plus the
padding; `unpack_kmajor` inverts it (tests, and any path that needs the stored layout back).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KMAJOR_FORMATS = ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")
_ONE = {"mx": 127, "nvfp4": 0x38}  # the scale code of 1.0: E8M0 2^0, E4M3 1.0


def codes_per_word(fmt: str) -> int:
    """E: codes per int32 word, 8 for the 4-bit formats, 4 for 8-bit."""
    return 8 if fmt in ("mxfp4", "nvfp4") else 4


@dataclass
class KMajorWeight:
    """A weight in the plane layout: words int32 [KP / E, N], scale uint8 [KP / B, N], NVFP4's fp32 tensor scale;
    K the true reduction length, KP the padded one (a multiple of group = E * block)."""

    fmt: str
    words: torch.Tensor
    scale: torch.Tensor
    tensor_scale: torch.Tensor | None
    N: int
    K: int
    KP: int
    block: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.N, self.K)

    @property
    def group(self) -> int:
        return codes_per_word(self.fmt) * self.block

    def nbytes(self) -> int:
        ts = 0 if self.tensor_scale is None else self.tensor_scale.numel() * 4
        return self.words.numel() * 4 + self.scale.numel() + ts


def pack_kmajor(q) -> KMajorWeight:
    """QTensor (a KMAJOR_FORMATS format, 2-D) -> KMajorWeight on q's device (a few torch ops over the codes)."""
    if q.fmt not in KMAJOR_FORMATS:
        raise ValueError(f"q.fmt={q.fmt!r}: the kgemm layout holds {', '.join(KMAJOR_FORMATS)}")
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D (N, K) weight, got shape {q.shape}")
    N, K = q.shape
    E, B = codes_per_word(q.fmt), q.spec.block
    group = E * B
    KP = -(-K // group) * group
    G = KP // group
    codes = q.codes() if E == 8 else q.data
    codes = torch.nn.functional.pad(codes.to(torch.uint8), (0, KP - K))
    # [N, G, j, i] -> [G, i, N, j]: word (g * B + i, n), slot j
    slots = codes.reshape(N, G, E, B).permute(1, 3, 0, 2)
    if E == 8:  # byte b of the word = slot 2b (low nibble) | slot 2b + 1 (high nibble)
        slots = slots[..., 0::2] | (slots[..., 1::2] << 4)
    words = slots.contiguous().view(torch.int32).reshape(G * B, N)  # little-endian: byte b at bits 8b
    scale = torch.nn.functional.pad(q.scale, (0, KP // B - q.scale.shape[1]), value=_ONE[q.spec.family])
    return KMajorWeight(q.fmt, words.contiguous(), scale.t().contiguous(), q.tensor_scale, N, K, KP, B)


def unpack_kmajor(w: KMajorWeight):
    """KMajorWeight -> the QTensor it came from (padding dropped)."""
    from synodic.quant.pack import pack_uint4
    from synodic.quant.qtensor import QTensor
    E, B = codes_per_word(w.fmt), w.block
    G = w.KP // (E * B)
    by = w.words.contiguous().view(torch.uint8).reshape(G, B, w.N, 4)
    if E == 8:
        by = torch.stack([by & 0xF, by >> 4], dim=-1).reshape(G, B, w.N, 8)
    codes = by.permute(2, 0, 3, 1).reshape(w.N, w.KP)[:, :w.K]  # [N, G, j, i]
    data = pack_uint4(codes) if E == 8 else codes
    scale = w.scale.t()[:, :w.K // B]
    return QTensor(w.fmt, data.contiguous(), scale.contiguous(), w.tensor_scale, (w.N, w.K))


def dequant_kmajor(w: KMajorWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [N, K] weight the layout holds, straight from the planes (plain torch; the kernel's reference reads
    the layout itself, not the un-packed QTensor, so a layout bug cannot cancel out)."""
    from synodic.quant.elements import E2M1, E4M3, E5M2
    from synodic.quant.mx import e8m0_to_fp32
    E, B = codes_per_word(w.fmt), w.block
    G = w.KP // (E * B)
    wd = w.words.to(torch.int64) & 0xFFFFFFFF
    bits = 4 if E == 8 else 8
    slots = torch.stack([(wd >> (bits * j)) & ((1 << bits) - 1) for j in range(E)], dim=-1)  # [G*B, N, E]
    codes = slots.reshape(G, B, w.N, E).permute(2, 0, 3, 1).reshape(w.N, w.KP).to(torch.uint8)
    elem = {"mxfp4": E2M1, "nvfp4": E2M1, "mxfp8_e4m3": E4M3, "mxfp8_e5m2": E5M2}[w.fmt]
    v = elem.decode(codes).float().reshape(w.N, w.KP // B, B)
    sc = w.scale.t()
    if w.fmt == "nvfp4":
        f = E4M3.decode(sc).float()
        if w.tensor_scale is not None:
            f = f * w.tensor_scale.float().reshape(())
    else:
        f = e8m0_to_fp32(sc)
    return (v * f[..., None]).reshape(w.N, w.KP)[:, :w.K].to(dtype)


def kgemm_ref(x: torch.Tensor, w: KMajorWeight, s: torch.Tensor | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of the kgemm kernel: y = (x * s) @ W^T + bias in fp32, returned in x.dtype."""
    a = x.float() if s is None else x.float() * s.float()
    y = a @ dequant_kmajor(w).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
