"""Torch reference of `dequant`: the quant package's decode in fp32, rounded once to the output dtype."""
from __future__ import annotations

import torch


def dequant_ref(q, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    from synodic.quant.qtensor import dequantize

    return dequantize(q, torch.float32).to(dtype)
