"""Test-wide setup: Triton kernels run under the interpreter when there is no GPU."""
import os

import torch

if not torch.cuda.is_available():
    # Must be set before triton is first imported; kernel tests then run on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Test tensors are tiny: intra-op threads buy nothing and OpenMP barriers stall on a shared CPU.
    torch.set_num_threads(1)

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
