"""copy_rows: Triton kernel vs reference, exact, on odd widths and several row blocks."""
import pytest
import torch
from synodic.kernels.row_copy import copy_rows


@pytest.mark.parametrize("W,M,dtype", [(5, 3, torch.float32), (37, 19, torch.bfloat16)])
def test_triton_matches_ref(W, M, dtype, device):
    gen = torch.Generator().manual_seed(W)
    src = torch.randn(23, W, generator=gen).to(dtype).to(device)
    src_rows = torch.randint(0, 23, (M,), generator=gen).to(device)
    dst_rows = torch.randperm(29, generator=gen)[:M].to(device)
    a = torch.full((29, W), float("nan"), dtype=dtype, device=device)
    b = a.clone()
    copy_rows(a, dst_rows, src, src_rows, backend="triton")
    copy_rows(b, dst_rows, src, src_rows, backend="ref")
    assert torch.equal(a.nan_to_num(3.0), b.nan_to_num(3.0))
    assert torch.equal(a[dst_rows], src[src_rows])
