"""fetch_rows (a verify window's shared-retrieval fetch): Triton kernel vs torch reference on odd shapes;
entries with a negative source row leave their destination untouched."""
import pytest
import torch
from synodic.kernels.kv_resolve.fetch import fetch_rows


@pytest.mark.parametrize("M,W", [(1, 1), (13, 7), (37, 1030), (8, 64)])
def test_triton_matches_ref_and_skips_masked(M, W, device):
    gen = torch.Generator().manual_seed(M * 31 + W)
    src = torch.randn(50, W, generator=gen)
    src_rows = torch.randint(0, 50, (M,), generator=gen)
    src_rows[torch.rand(M, generator=gen) < 0.4] = -1
    dst_rows = torch.randperm(M + 5, generator=gen)[:M]
    out = {}
    for backend in ("ref", "triton"):
        dst = torch.full((M + 5, W), 9.0, device=device)
        fetch_rows(dst, dst_rows.to(device), src.to(device), src_rows.to(device), backend=backend)
        out[backend] = dst.cpu()
    assert torch.equal(out["ref"], out["triton"])
    live = src_rows >= 0
    assert torch.equal(out["ref"][dst_rows[live]], src[src_rows[live]])
    untouched = torch.ones(M + 5, dtype=torch.bool)
    untouched[dst_rows[live]] = False
    assert bool((out["ref"][untouched] == 9.0).all())


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="dst_rows/src_rows"):
        fetch_rows(torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), torch.zeros(4, 3),
                   torch.zeros(3, dtype=torch.long))
