"""Quant tests run torch single-threaded: their ops are elementwise passes over a few MB, where intra-op
threads buy little and, on a shared CPU, OpenMP barriers stall them (measured: 50x slower at load 5)."""

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
