"""Test-wide setup: Triton kernels run under the interpreter when there is no GPU."""
import os
import sys
from pathlib import Path

import torch

# The repo root goes last on sys.path: tests import `benchmarks` (only there), but the root's `kernels/` folder
# (installed as `synodic.kernels`) must not shadow Hugging Face's `kernels`, which transformers imports.
# `python -m pytest` puts the working directory first, so every spelling of the root is moved, not just added.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT] + [str(ROOT)]

if not torch.cuda.is_available():
    # Must be set before triton is first imported; kernel tests then run on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Test tensors are tiny: intra-op threads buy nothing and OpenMP barriers stall on a shared CPU.
    torch.set_num_threads(1)

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
