"""ngram_hints: the Triton kernel against the torch reference and both against the host rule
(synodic.spec.ngram.lookup) over random repetitive histories: odd widths, rows sharing nothing, positions at 0,
at the history's end and past it, padding rows on one scratch row; argument errors."""
import pytest
import torch
from synodic.kernels.ngram_lookup import ngram_hints, ngram_hints_ref

from synodic.spec.ngram import lookup


def _case(seed: int, slots: int, T: int, B: int, vocab: int, device):
    g = torch.Generator().manual_seed(seed)
    hist = torch.randint(0, vocab, (slots, T), generator=g)
    rows = torch.randperm(slots, generator=g)[:B]
    pos = torch.randint(0, T + 3, (B,), generator=g)  # some past the end: clamped to T - 1
    pos[0] = 0
    anchors = torch.randint(0, vocab, (B,), generator=g)
    return hist.to(device), rows.to(device), anchors.to(device), pos.to(device)


@pytest.mark.parametrize("seed,slots,T,B,vocab,gamma,mx,mn", [
    (0, 5, 37, 4, 3, 5, 4, 1),      # tiny vocabulary: long matches everywhere
    (1, 9, 300, 7, 6, 7, 4, 2),     # several blocks of candidate ends, min_ngram 2
    (2, 3, 11, 3, 2, 3, 6, 1),      # max_ngram past most positions
    (3, 4, 64, 4, 50, 1, 3, 3),     # rare matches, gamma 1
    (4, 3, 9, 3, 2, 4, 60, 1),      # max_ngram longer than the whole history (spec.max_ngram=60)
])
def test_triton_matches_ref_and_host_rule(seed, slots, T, B, vocab, gamma, mx, mn, device):
    hist, rows, anchors, pos = _case(seed, slots, T, B, vocab, device)
    h_ref, h_tri = hist.clone(), hist.clone()
    want = ngram_hints_ref(h_ref, rows, anchors, pos, gamma, mx, mn)
    got = ngram_hints(h_tri, rows, anchors, pos, gamma, mx, mn, backend="triton")
    assert torch.equal(got, want) and torch.equal(h_tri, h_ref)  # the anchors written alike
    for b in range(B):
        p = min(int(pos[b]), T - 1)
        ctx = h_ref[int(rows[b]), :p + 1].tolist()
        host = lookup(ctx, gamma, mx, mn)
        assert want[b].tolist() == (host + [-1] * gamma)[:gamma], (b, p)


def test_padding_rows_share_the_scratch_row(device):
    """A captured step's padding rows all read and write one scratch row at position 0: no lookup, no hints."""
    hist = torch.randint(0, 4, (3, 20)).to(device)
    rows = torch.tensor([0, 2, 2, 2]).to(device)
    pos = torch.tensor([10, 0, 0, 0]).to(device)
    got = ngram_hints(hist, rows, torch.tensor([1, 0, 0, 0]).to(device), pos, 4, 3, backend="triton")
    assert (got[1:] == -1).all()


def test_argument_errors():
    h, r = torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="history: expected int64"):
        ngram_hints(h.int(), r, r, r, 3, 2)
    with pytest.raises(ValueError, match="history: expected int64 .* contiguous rows"):
        ngram_hints(torch.zeros(8, 2, dtype=torch.long).t(), r, r, r, 3, 2)
    with pytest.raises(ValueError, match="positions: expected int64"):
        ngram_hints(h, r, r, r[:1], 3, 2)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        ngram_hints(h, r, r, r, 3, 2, 3)
