"""Which cuBLAS front end a step's GEMMs run on.

On fp32 GEMMs of 2–16 rows (a verify window at batch 1–2, a short prefill) cuBLAS's heuristic picks kernels
that take 25–52 µs on the embedded models' shapes, where cuBLASLt takes 3–8 µs; from 24 rows up cuBLASLt is
up to 2x slower, and at one row they tie (BENCHMARKS.md, G1). A step's GEMMs share its row count, so the
choice is made per step: the rows select the library, and a CUDA graph keeps what its capture chose."""
from contextlib import contextmanager

import torch

LT_ROWS = range(2, 17)  # fp32 rows where cuBLASLt wins on every measured shape


def prefers_lt(rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    return (device.type == "cuda" and torch.version.cuda is not None and dtype == torch.float32
            and rows in LT_ROWS)


@contextmanager
def blas_for(rows: int, dtype: torch.dtype, device: torch.device):
    """cuBLASLt for the duration of a step of `rows` GEMM rows where it wins, the current library otherwise."""
    if not prefers_lt(rows, dtype, device):
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)
