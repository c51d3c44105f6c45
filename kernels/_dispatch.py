"""What every op's public function shares: backend choice and one-line shape errors."""
from __future__ import annotations

import os

import torch


def pick_backend(backend: str, t: torch.Tensor) -> str:
    """'auto' → Triton on CUDA tensors, the torch reference otherwise; 'triton' also runs CPU tensors
    under the interpreter (TRITON_INTERPRET=1)."""
    if backend == "auto":
        return "triton" if t.is_cuda else "ref"
    if backend == "ref":
        return "ref"
    if backend == "triton":
        if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("backend: 'triton' needs CUDA tensors (or TRITON_INTERPRET=1); use 'ref' or 'auto'")
        return "triton"
    raise ValueError(f"backend: expected 'auto', 'triton' or 'ref', got {backend!r}")


def expect_shape(name: str, t: torch.Tensor, shape: tuple, desc: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {desc} = {tuple(shape)}, got {tuple(t.shape)}")


def strides(*ts: torch.Tensor) -> tuple[int, ...]:
    """Every stride of each tensor, in order: a kernel's stride arguments."""
    return tuple(st for t in ts for st in t.stride())


def round_flags(state: torch.Tensor, out: torch.Tensor) -> dict:
    """ROUND_STATE / ROUND_OUT of the eager SSM kernels: under the interpreter, whose fp32 -> bf16 cast truncates,
    round bf16 stores in fp32 first (the GPU's cast rounds to nearest even)."""
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return dict(ROUND_STATE=interp and state.dtype == torch.bfloat16, ROUND_OUT=interp and out.dtype == torch.bfloat16)
