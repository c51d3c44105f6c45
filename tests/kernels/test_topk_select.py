"""topk_select: Triton kernel vs the stable-sort reference, exactly (same ids in the same order), over odd row
lengths, cursors below and above top_k, heavy ties (scores on a coarse grid), -0 / +0, -inf, NaN, and rows whose
selection is one position (padding rows at pos 0)."""
import pytest
import torch
from synodic.kernels.topk_select import topk_select, topk_select_ref


def scores_for(N, T, gen, kind):
    s = torch.randn(N, T, generator=gen)
    if kind == "ties":
        s = (s * 2).round() / 2          # ~10 distinct values: long runs of equal scores
    elif kind == "special":
        s = (s * 2).round() / 2
        s[torch.rand(N, T, generator=gen) < 0.1] = -0.0
        s[torch.rand(N, T, generator=gen) < 0.1] = 0.0
        s[torch.rand(N, T, generator=gen) < 0.05] = float("-inf")
        s[torch.rand(N, T, generator=gen) < 0.03] = float("nan")
        s[torch.rand(N, T, generator=gen) < 0.02] = float("inf")
    return s


CASES = [  # N, T, top_k, kind
    (3, 37, 5, "random"),
    (4, 100, 16, "ties"),
    (5, 257, 64, "special"),
    (2, 9, 12, "ties"),        # top_k > T
    (6, 1000, 100, "special"),
    (1, 1, 1, "random"),
]


@pytest.mark.parametrize("N,T,top_k,kind", CASES)
def test_triton_matches_stable_sort(N, T, top_k, kind, device):
    gen = torch.Generator().manual_seed(N * 1000 + T)
    s = scores_for(N, T, gen, kind).to(device)
    pos = torch.randint(0, T, (N,), generator=gen)
    pos[0] = T - 1                              # the whole row
    if N > 1:
        pos[1] = 0                              # one position (a padding row)
    if N > 2:
        pos[2] = min(T - 1, max(0, top_k // 2))  # fewer candidates than top_k
    pos = pos.to(device)
    got = topk_select(s, pos, top_k, backend="triton")
    want = topk_select_ref(s, pos, top_k)
    assert got.dtype == torch.int32 and got.shape == (N, top_k)
    assert torch.equal(got, want), (got, want)


def test_errors():
    with pytest.raises(ValueError, match="scores: expected shape"):
        topk_select(torch.zeros(3), torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="pos: expected shape"):
        topk_select(torch.zeros(2, 5), torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="top_k: expected"):
        topk_select(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), 0)
