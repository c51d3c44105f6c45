"""Torch reference of `quant_linear`: dequantize the packed weight, then a plain fp32 matmul.

    y = act(x * s) @ dequant(q).T + bias        (fp32 math, returned in x.dtype)

act is the identity, or MXFP4 fake quantization (blocks of 32 along K, E8M0 'floor' scales) when
act_quant='mxfp4'. The multiply by s happens in fp32 before the activation quantizer.
"""
from __future__ import annotations

import torch


def quant_linear_ref(x: torch.Tensor, q, s: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     act_quant: str | None = None) -> torch.Tensor:
    from synodic.quant.qtensor import dequantize, fake_quant

    w = dequantize(q, torch.float32)
    a = x.float() if s is None else x.float() * s.float()
    if act_quant is not None:
        a = fake_quant(a, act_quant)
    y = a @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
