"""topk_select: Triton kernels (one program per row, and the row split over programs) vs the stable-sort reference,
exactly (same ids in the same order), over odd row lengths, cursors below and above top_k and past the row, heavy
ties (scores on a coarse grid; runs of equal scores across the split path's chunks), -0 / +0, +-inf, NaN, and rows
whose selection is one position (padding rows at pos 0)."""
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


@pytest.mark.parametrize("split", [False, None])  # the single program, and the default (split for <= 8 rows)
@pytest.mark.parametrize("N,T,top_k,kind", CASES)
def test_triton_matches_stable_sort(N, T, top_k, kind, split, device):
    gen = torch.Generator().manual_seed(N * 1000 + T)
    s = scores_for(N, T, gen, kind).to(device)
    pos = torch.randint(0, T, (N,), generator=gen)
    pos[0] = T - 1                              # the whole row
    if N > 1:
        pos[1] = 0                              # one position (a padding row)
    if N > 2:
        pos[2] = min(T - 1, max(0, top_k // 2))  # fewer candidates than top_k
    pos = pos.to(device)
    if split is None:
        got = topk_select(s, pos, top_k, backend="triton")
    else:
        from synodic.kernels.topk_select.triton_impl import topk_select_triton
        got = topk_select_triton(s, pos, top_k, split=split)
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


def runs_for(N, T, gen, run):
    # runs of `run` equal scores (crossing chunk boundaries), drawn from a few values with NaN, +-inf, +-0
    vals = torch.tensor([float("nan"), float("inf"), 1.5, 0.0, -0.0, -2.0, float("-inf")])
    idx = torch.randint(0, len(vals), (N, -(-T // run)), generator=gen)
    return vals[idx].repeat_interleave(run, dim=1)[:, :T].contiguous()


SPLIT_CASES = [  # N, T, top_k, chunk, kind, pos per row (None: random)
    (3, 333, 70, 32, "runs", [332, 0, 40]),
    (3, 301, 45, 64, "special", [400, 3, None]),   # pos past the row
    (1, 517, 100, 64, "random", [None]),
    (3, 260, 64, 32, "ties", [259, 63, 0]),
    (3, 20, 37, 16, "special", [19, 25, 7]),        # top_k > T
    (1, 1, 3, 16, "random", [0]),
]


@pytest.mark.parametrize("N,T,top_k,chunk,kind,rows", SPLIT_CASES)
def test_split_matches_stable_sort(N, T, top_k, chunk, kind, rows, device):
    from synodic.kernels.topk_select.triton_impl import topk_select_triton

    gen = torch.Generator().manual_seed(7 * T + top_k)
    s = runs_for(N, T, gen, run=45) if kind == "runs" else scores_for(N, T, gen, kind)
    pos = torch.tensor([int(torch.randint(0, T, (), generator=gen)) if p is None else p for p in rows])
    s, pos = s.to(device), pos.to(device)
    got = topk_select_triton(s, pos, top_k, split=True, chunk=chunk)
    want = topk_select_ref(s, pos, top_k)
    assert got.dtype == torch.int32 and got.shape == (N, top_k)
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("T,rows", [(16448, [16447, 3000]), (65600, [65599])])
def test_long_rows_take_split_path(T, rows, device):
    # the workload's shapes (257+ pages of 64, top-k 2048) through the public entry: split path, default chunk
    gen = torch.Generator().manual_seed(T)
    s = scores_for(len(rows), T, gen, "special").to(device)
    pos = torch.tensor(rows, device=device)
    assert torch.equal(topk_select(s, pos, 2048, backend="triton"), topk_select_ref(s, pos, 2048))
