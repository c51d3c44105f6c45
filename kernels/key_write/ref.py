"""Plain-torch reference of `write_keys_fp8`: the index keys' fp8 quantization (one fp32 scale per row) and the
scatter into the paged cache, as the KV policies' torch path computes them."""
from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8_ref(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k [..., d] -> (codes float8_e4m3fn [..., d], scale fp32 [...]): scale = max(amax * fp32(1 / 448), 1e-12),
    codes = round-to-nearest-even of k / scale. (A multiply by the reciprocal, not a divide: torch's CUDA division
    by a scalar multiplies by the reciprocal, so this is what every device computes alike.)"""
    kf = k.float()
    scale = (kf.abs().amax(-1) * (1.0 / FP8_MAX)).clamp_min(1e-12)
    return (kf / scale[..., None]).to(torch.float8_e4m3fn), scale


def write_keys_fp8_ref(keys: torch.Tensor, scales: torch.Tensor, page: torch.Tensor, off: torch.Tensor,
                       k: torch.Tensor) -> None:
    kq, scale = quantize_fp8_ref(k)
    keys[page, off] = kq
    scales[page, off] = scale
