"""The K-major plane layout of the "kgemm" kernel (kgemm.py): the stored QTensor codes repacked once, at load.

The checkpoint keeps the QTensor layout (codes [N, K/2] or [N, K] uint8, even k in the low nibble; block scales
[N, K/B]). kgemm reads

    words   int32 [KP / E, N]       (E = 8 codes per word for 4-bit formats, 4 for 8-bit; N contiguous)
    factors int32 [KP / (2 B), N]   (two blocks' bf16 factors scale * 2^(R - 64) per word, paired as the slots)

grouped along K in groups of GROUP = E * B codes (B: the format's block, 32 for MX, 16 for NVFP4): word row
g * B + i holds, in its code slot j (nibble j at bits 4j, or byte j at bits 8j), the code of

    k = g * GROUP + j * B + i        (i in 0..B-1, j in 0..E-1)

so slot j of a group's B word rows is one whole scale block (block g * E + j), K-contiguous. The kernel loads a
group's [B, BLOCK_N] words once and gets each slot's plane with one shift and mask: E planes of [B, BLOCK_N]
weights whose k are contiguous runs, each the B operand of its own tl.dot against the x columns [B rows of k]
it covers. No interleave of nibbles back into k order, no reshape or permute of the decoded tile: the permute
that cost the removed repacked-layout GEMM its layout conversions is done here, once, by torch. Slots j and
j + E/2 sit 16 bits apart, so one 32-bit integer op chain decodes two weights (kgemm._pair).

Factors, not scale codes: factor row g * E/2 + p holds, per n, the bf16 bit patterns of blocks g * E + p (low half)
and g * E + p + E/2 (high half), scale * 2^(R - 64) (R: the decode's shift, kgemm._pair; exact in bf16 for E8M0
scales 2^-61 .. 2^65 and every E4M3 scale). The kernel multiplies a pair of planes by one such word with one
bf16x2 multiply and decodes no scale: 2 bytes per block instead of 1 (MXFP4 4.5 bits a weight instead of 4.25,
NVFP4 5 instead of 4.5, MXFP8 8.5 instead of 8.25), bought because a 4-byte-per-n row is cp.async-pipelined with
the words and lands in the MMA operand layout, where per-plane byte rows went through a shared-memory layout
conversion and a barrier each (8 a group, offline sm_90 SASS). The codes are recovered exactly (`scale_codes`).

K is padded with zero codes to a multiple of GROUP (256 codes MXFP4, 128 NVFP4 and MXFP8), the scales with the
neutral code (1.0); the presets' K (2560, 4096, 14336, ...) need no padding. `unpack_kmajor` inverts the packing
(tests, and any path that needs the stored layout back).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KMAJOR_FORMATS = ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")
DSH = 64  # the factors carry 2^-DSH; the kernel's accumulator gets 2^DSH back
R_SHIFT = {"mxfp4": 126, "nvfp4": 126, "mxfp8_e4m3": 120, "mxfp8_e5m2": 112}  # kgemm._pair gives value * 2^-R


_ONE = {"mx": 127, "nvfp4": 0x38}  # the scale code of 1.0: E8M0 2^0, E4M3 1.0


def check_weight(q, formats: tuple[str, ...], layout: str) -> None:
    """q: a 2-D (N, K) QTensor in one of the formats a layout holds; `layout` words the error."""
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


def codes_per_word(fmt: str) -> int:
    """E: codes per int32 word, 8 for the 4-bit formats, 4 for 8-bit."""
    return 8 if fmt in ("mxfp4", "nvfp4") else 4


@dataclass
class KMajorWeight:
    """A weight in the plane layout: words int32 [KP / E, N], factors int32 [KP / (2 block), N], NVFP4's fp32 tensor
    scale; K the true reduction length, KP the padded one (a multiple of group = E * block)."""

    fmt: str
    words: torch.Tensor
    factors: torch.Tensor
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
        return self.words.numel() * 4 + self.factors.numel() * 4 + ts

    def block_factors(self) -> torch.Tensor:
        """fp32 [KP / B, N]: each block's scale (the factor without its 2^(R - 64))."""
        E = codes_per_word(self.fmt)
        f = self.factors.contiguous().view(torch.int16).reshape(-1, E // 2, self.N, 2)  # [G, p, n, lo / hi]
        f = f.permute(0, 3, 1, 2).reshape(-1, self.N).view(torch.bfloat16).float()  # blocks g * E + half * E/2 + p
        return f * 2.0 ** (DSH - R_SHIFT[self.fmt])

    def scale_codes(self) -> torch.Tensor:
        """uint8 [KP / B, N]: the block-scale codes the factors were made from (exact)."""
        from synodic.quant.elements import E4M3
        f = self.block_factors()
        if self.fmt == "nvfp4":
            return E4M3.encode(f)
        return ((f.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # 2^-127 (code 0) is the subnormal, field 0


def pack_kmajor(q) -> KMajorWeight:
    """QTensor (a KMAJOR_FORMATS format, 2-D) -> KMajorWeight on q's device (a few torch ops over the codes)."""
    check_weight(q, KMAJOR_FORMATS, "the kgemm layout holds")
    N, K = q.shape
    E, B = codes_per_word(q.fmt), q.spec.block
    group = E * B
    KP = -(-K // group) * group
    G = KP // group
    codes = padded_codes(q, KP)
    # [N, G, j, i] -> [G, i, N, j]: word (g * B + i, n), slot j
    slots = codes.reshape(N, G, E, B).permute(1, 3, 0, 2)
    if E == 8:  # byte b of the word = slot 2b (low nibble) | slot 2b + 1 (high nibble)
        slots = slots[..., 0::2] | (slots[..., 1::2] << 4)
    words = slots.contiguous().view(torch.int32).reshape(G * B, N)  # little-endian: byte b at bits 8b
    factors = _factors(padded_scale(q, KP).t(), q.fmt).reshape(G, 2, E // 2, N)  # blocks g * E + half * E/2 + p
    factors = (factors[:, 0].to(torch.int32) & 0xFFFF) | (factors[:, 1].to(torch.int32) << 16)
    return KMajorWeight(q.fmt, words.contiguous(), factors.reshape(G * E // 2, N).contiguous(), q.tensor_scale, N,
                        K, KP, B)


def _factors(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Block-scale codes -> int16 bf16 bit patterns of scale * 2^(R - DSH) (exact; see the module docstring)."""
    from synodic.quant.elements import E4M3
    from synodic.quant.mx import e8m0_to_fp32
    v = E4M3.decode(codes).float() if fmt == "nvfp4" else e8m0_to_fp32(codes)
    return (v * 2.0 ** (R_SHIFT[fmt] - DSH)).to(torch.bfloat16).view(torch.int16)


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
    scale = w.scale_codes().t()[:, :w.K // B]
    return QTensor(w.fmt, data.contiguous(), scale.contiguous(), w.tensor_scale, (w.N, w.K))


def dequant_kmajor(w: KMajorWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [N, K] weight the layout holds, straight from the planes (plain torch; the kernel's reference reads
    the layout itself, not the un-packed QTensor, so a layout bug cannot cancel out)."""
    from synodic.quant.elements import E2M1, E4M3, E5M2
    E, B = codes_per_word(w.fmt), w.block
    G = w.KP // (E * B)
    wd = w.words.to(torch.int64) & 0xFFFFFFFF
    bits = 4 if E == 8 else 8
    slots = torch.stack([(wd >> (bits * j)) & ((1 << bits) - 1) for j in range(E)], dim=-1)  # [G*B, N, E]
    codes = slots.reshape(G, B, w.N, E).permute(2, 0, 3, 1).reshape(w.N, w.KP).to(torch.uint8)
    elem = {"mxfp4": E2M1, "nvfp4": E2M1, "mxfp8_e4m3": E4M3, "mxfp8_e5m2": E5M2}[w.fmt]
    v = elem.decode(codes).float().reshape(w.N, w.KP // B, B)
    f = w.block_factors().t()
    if w.tensor_scale is not None:
        f = f * w.tensor_scale.float().reshape(())
    return (v * f[..., None]).reshape(w.N, w.KP)[:, :w.K].to(dtype)


def kgemm_ref(x: torch.Tensor, w: KMajorWeight, s: torch.Tensor | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of the kgemm kernel: y = (x * s) @ W^T + bias in fp32, returned in x.dtype."""
    a = x.float() if s is None else x.float() * s.float()
    y = a @ dequant_kmajor(w).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
