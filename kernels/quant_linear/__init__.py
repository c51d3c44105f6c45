"""Linear layer from packed block-quantized weights, for decode (M = 1..64 rows).

    y = act(x * s) @ dequant(q).T + bias

q: a `synodic.quant.QTensor` of an (N, K) weight in mxfp4, nvfp4, mxfp8_e4m3 or mxfp8_e5m2, used in the
layout it is stored in (packed codes [N, K/2] or [N, K] uint8, block scales [N, K/B] uint8, NVFP4's
fp32 per-tensor scale). s: optional per-input-channel fp32 multiplier (DualQuant's beta^-1 /
SmoothQuant's 1/t), fused before the activation quantizer. act_quant: None (weight-only: W4A16,
W8A16) or 'mxfp4' (activations fake-quantized in-kernel to MXFP4, 'floor' scale rule: emulated W4A4
— Hopper has no FP4 tensor cores, so the matmul itself runs in the activation dtype).

The weights are dequantized in registers, so decode reads ~4.25 bits (MXFP4) / 4.5 bits (NVFP4) per
weight instead of 16. Backends: "auto" (Triton on CUDA tensors, reference otherwise) | "triton" | "ref".

Kernels (dot.py, dotp.py, gemv32.py, gemvh.py, tc.py; configs and launch in launch.py): "gemvh" (CUDA-core GEMV
for one or two rows with fp16x2 FMAs), "gemv32" (the same from fp32 arithmetic, one row), "dotp" and "dot" (tl.dot,
any M), "tc" (a plain tensor-core GEMM, any M, by config only); the default config takes gemvh for M <= 2 with
bf16 / fp16 activations, gemv32 for one fp32 row, dotp above. Their speed against the bf16 linear per format and
row count: docs/tuning/quant_linear.md.
"kgemm" (kgemm.py; kmajor.py; configs and launch in kgemm_launch.py) is the packed GEMM for 2-256+ rows over the
K-major plane layout (a QTensor passed as pack_kmajor(q), a kmajor.KMajorWeight): no shuffle of decoded data;
QuantLinear routes to it only from synodic.quant.linear.KGEMM_MIN_ROWS (empty until a GPU run shows a win).
QuantLinear runs the kernel where it beats the bf16 linear (synodic.quant.linear.KERNEL_MAX_ROWS: MXFP4 and NVFP4
up to 32 rows, MXFP8 up to 16; one row for fp32
activations), or up to 128 rows when the layer keeps no dense copy (PACKED_ONLY_MAX_ROWS). A call without a
config takes the GPU's tuned table entry for its shape where there is one (tuned.py). gemvh rounds products to
fp16 (rel. error ~1.5e-3 vs the fp32 reference); on bf16 activations the dot path rounds x * s to bf16 before the
MMA (rel. error ~1e-3; fp32 activations run an IEEE fp32 dot).
"""
from __future__ import annotations

import os

import torch

from .kmajor import KMajorWeight, kgemm_ref, pack_kmajor, unpack_kmajor
from .ref import quant_linear_ref

__all__ = ["KERNEL_FORMATS", "KMajorWeight", "kgemm_ref", "pack_kmajor", "quant_linear", "quant_linear_ref",
           "unpack_kmajor"]

KERNEL_FORMATS = ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")
ACT_QUANT = (None, "mxfp4")


def _check(x, q, s, bias, act_quant) -> None:
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D (N, K) weight, got shape {q.shape}")
    N, K = q.shape
    if x.shape[-1] != K:
        raise ValueError(f"x: expected last dim K={K} (the weight's), got shape {tuple(x.shape)}")
    if s is not None and tuple(s.shape) != (K,):
        raise ValueError(f"s: expected shape ({K},), got {tuple(s.shape)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias: expected shape ({N},), got {tuple(bias.shape)}")
    if act_quant not in ACT_QUANT:
        raise ValueError(f"act_quant: expected None or 'mxfp4', got {act_quant!r}")
    if act_quant is not None and K % 32:
        raise ValueError(f"act_quant='mxfp4': K={K} must be a multiple of its block 32")
    data, scale = (q.words, q.factors) if isinstance(q, KMajorWeight) else (q.data, q.scale)
    for name, t in (("q.data", data), ("q.scale", scale), ("s", s), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")


def quant_linear(x: torch.Tensor, q, s: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                 act_quant: str | None = None, backend: str = "auto", config: dict | None = None) -> torch.Tensor:
    """x [..., K] (bf16 / fp16 / fp32) -> y [..., N] in x.dtype. q: a QTensor (the stored layout), or a
    kmajor.KMajorWeight (KERNEL 'kgemm', configs per kgemm_launch.resolve_kgemm_config; the reference decodes the
    planes). `config` overrides the Triton launch config (KERNEL dot | gemv32 | dotp | gemvh | tc, BLOCK_N,
    BLOCK_K, SPLIT_K, num_warps, num_stages, SEM (in-kernel split-K reduction), BLOCK_M (dot, dotp, tc: rows per
    tile; gemvh: 1 or 2), SWAP (tc: the weight as the MMA's A operand), and for dot TWO_MUL (exact decode for any
    block scale); see launch.resolve_config; for MXFP8, FP8_CVT=True decodes with the hardware fp8 conversion in
    dot)."""
    _check(x, q, s, bias, act_quant)
    if isinstance(q, KMajorWeight):
        return _kgemm(x, q, s, bias, act_quant, backend, config)
    if backend == "auto":
        backend = "triton" if x.is_cuda and q.fmt in KERNEL_FORMATS else "ref"
    if backend == "ref":
        return quant_linear_ref(x, q, s, bias, act_quant)
    if backend != "triton":
        raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")
    if q.fmt not in KERNEL_FORMATS:
        raise ValueError(f"q.fmt={q.fmt!r}: the kernel reads {', '.join(KERNEL_FORMATS)}; use backend='ref'")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1); expected quant.backend=auto "
                         "or torch (quant_linear's own backend='ref' or 'auto')")
    from .launch import quant_linear_triton
    N, K = q.shape
    x2d = x.reshape(-1, K).contiguous()
    p = None if q.tensor_scale is None else q.tensor_scale.reshape(1).to(torch.float32)
    s = None if s is None else s.to(torch.float32).contiguous()
    if act_quant is not None and q.spec.block != 32:  # in-kernel MXFP4 blocks need 32-blocks of weights
        from synodic.quant.qtensor import fake_quant
        x2d = fake_quant(x2d.float() if s is None else x2d.float() * s, act_quant).to(x.dtype)
        s, act_quant = None, None
    y = quant_linear_triton(x2d, q.data.contiguous(), q.scale.contiguous(), p, q.fmt, q.spec.block, s, bias,
                            act_quant, config)
    return y.reshape(*x.shape[:-1], N)


def _kgemm(x, w, s, bias, act_quant, backend, config) -> torch.Tensor:
    """quant_linear on a KMajorWeight: the kgemm kernel (act_quant: x quantized in torch first, the GEMM is
    weight-only), or its reference (kmajor.kgemm_ref, which decodes the plane layout itself)."""
    if backend == "auto":
        backend = "triton" if x.is_cuda else "ref"
    if backend not in ("ref", "triton"):
        raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")
    if backend == "triton" and not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1); expected quant.backend=auto "
                         "or torch (quant_linear's own backend='ref' or 'auto')")
    x2d = x.reshape(-1, w.K)
    if act_quant is not None:
        from synodic.quant.qtensor import fake_quant
        x2d = fake_quant(x2d.float() if s is None else x2d.float() * s, act_quant).to(x.dtype)
        s = None
    if backend == "ref":
        return kgemm_ref(x2d, w, s, bias).reshape(*x.shape[:-1], w.N)
    from .kgemm_launch import quant_kgemm_triton
    s = None if s is None else s.to(torch.float32).contiguous()
    y = quant_kgemm_triton(x2d.contiguous(), w, s, bias, config)
    return y.reshape(*x.shape[:-1], w.N)
