"""Registry of the block formats: what an element is, how many share a scale, what the scale is."""

from __future__ import annotations

from dataclasses import dataclass

from synodic.quant.elements import E2M1, E2M3, E3M2, E4M3, E5M2, INT4, INT8_MX, FloatElem, IntElem


@dataclass(frozen=True)
class FormatSpec:
    """One quantization format. Blocks run along the last dim (the reduction dim K).

    family: 'mx' (E8M0 power-of-two block scale), 'nvfp4' (E4M3 block scale times an optional FP32
    per-tensor scale), 'int' (FP32 block scale, symmetric integer grid)."""

    name: str
    family: str
    elem: FloatElem | IntElem
    block: int
    doc: str

    @property
    def scale_bits(self) -> int:
        return 32 if self.family == "int" else 8

    @property
    def bits_per_element(self) -> float:
        """Storage cost per weight, block scales included (the per-tensor scale is negligible)."""
        return self.elem.bits + self.scale_bits / self.block


FORMATS: dict[str, FormatSpec] = {
    f.name: f
    for f in (
        FormatSpec("mxfp4", "mx", E2M1, 32, "OCP MXFP4: E2M1 elements, E8M0 scale per 32"),
        FormatSpec("mxfp6_e2m3", "mx", E2M3, 32, "OCP MXFP6: E2M3 elements, E8M0 scale per 32"),
        FormatSpec("mxfp6_e3m2", "mx", E3M2, 32, "OCP MXFP6: E3M2 elements, E8M0 scale per 32"),
        FormatSpec("mxfp8_e4m3", "mx", E4M3, 32, "OCP MXFP8: E4M3fn elements, E8M0 scale per 32"),
        FormatSpec("mxfp8_e5m2", "mx", E5M2, 32, "OCP MXFP8: E5M2 elements, E8M0 scale per 32"),
        FormatSpec("mxint8", "mx", INT8_MX, 32, "OCP MXINT8: int8 with implicit 2^-6, E8M0 scale per 32"),
        FormatSpec("nvfp4", "nvfp4", E2M1, 16, "NVFP4: E2M1, E4M3 scale per 16, FP32 per-tensor scale"),
        FormatSpec("int4_g64", "int", INT4, 64, "symmetric INT4 (-7..7), FP32 scale per group of 64"),
    )
}


def get_format(fmt: str | FormatSpec) -> FormatSpec:
    if isinstance(fmt, FormatSpec):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown quant format {fmt!r}; expected one of: {', '.join(FORMATS)}") from None


def check_blocks(shape: tuple[int, ...], spec: FormatSpec) -> None:
    if len(shape) == 0 or shape[-1] % spec.block:
        raise ValueError(
            f"{spec.name}: last dim of shape {tuple(shape)} must be a multiple of the block size {spec.block}"
        )
