"""Dequantize a packed block-quantized weight into a dense tensor (the model dtype), on the device.

    w = dequant(q)[n, k] = element(code[n, k]) * block_scale[n, k // B]   (NVFP4: * its per-tensor scale)

Why: a QuantLinear that keeps no dequantized copy of its weight (`quant.dense_copy=false`: weights resident at
the format's width) still runs prefill and large decode batches as a dense matmul, which wants the dense weight
for the duration of one call. The torch decode (`synodic.quant.qtensor.dequantize`) runs a dozen full-size
passes; this is one read of the codes and one write of the result (MXFP4 4096 x 14336: 29 MB in, 117 MB out).

Formats: mxfp4, nvfp4, mxfp8_e4m3, mxfp8_e5m2 (the packed kernels' formats, KERNEL_FORMATS); others take the
reference. Values are computed in fp32 exactly as the reference does (element times scale, NVFP4's scale first
multiplied by the tensor scale) and rounded once to the output dtype (round to nearest even).
"""
from __future__ import annotations

import torch

from .._dispatch import pick_backend
from ..quant_linear import KERNEL_FORMATS
from .ref import dequant_ref

__all__ = ["DEQUANT_FORMATS", "dequant", "dequant_ref"]

DEQUANT_FORMATS = KERNEL_FORMATS  # the formats the packed kernels read, and so the ones stored without a dense copy
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dequant(q, dtype: torch.dtype = torch.bfloat16, *, backend: str = "auto") -> torch.Tensor:
    """q: a `synodic.quant.QTensor` of a 2-D (N, K) weight -> dense [N, K] in dtype. backend: auto (Triton on
    CUDA for DEQUANT_FORMATS, the reference otherwise) | triton | ref."""
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D (N, K) weight, got shape {q.shape}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    if q.fmt not in DEQUANT_FORMATS:
        if backend == "triton":
            raise ValueError(f"q.fmt={q.fmt!r}: the dequant kernel reads {', '.join(DEQUANT_FORMATS)}; use "
                             "backend='ref' or 'auto'")
        backend = "ref" if backend == "auto" else backend
    if pick_backend(backend, q.data) == "ref":
        return dequant_ref(q, dtype)
    from .triton_impl import dequant_triton
    return dequant_triton(q, dtype)
