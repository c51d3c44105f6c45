"""The n-gram drafter's incremental index equals the plain scan (`lookup`) at every length of growing contexts."""
import random

from synodic.spec.ngram import NgramIndex, lookup


def test_incremental_index_equals_scan_on_growing_contexts():
    rng = random.Random(0)
    for trial in range(60):
        vocab = rng.choice([2, 3, 5, 50])
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        gamma = rng.randint(1, 7)
        ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        ix = NgramIndex(hi, lo)
        for _ in range(40):
            assert ix.drafts(ctx, gamma) == lookup(ctx, gamma, hi, lo), (trial, ctx)
            ctx += [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]  # a step appends 1..γ+1 tokens


def test_index_skips_steps_it_did_not_see():
    """Drafting only every few steps (rows without a spec step in between) still matches the scan."""
    ctx = [1, 2, 3, 1, 2, 4, 1, 2]
    ix = NgramIndex(3, 1)
    assert ix.drafts(ctx, 3) == lookup(ctx, 3, 3, 1) == [4, 1, 2]
    ctx += [4, 1, 2, 3, 9, 9, 1, 2]
    assert ix.drafts(ctx, 4) == lookup(ctx, 4, 3, 1)


def test_a_context_that_is_not_a_continuation_starts_over():
    """An index asked about a shorter context (a new request under an old one's id) drafts as the scan does,
    not from the text it indexed before."""
    ix = NgramIndex(3, 1)
    old = [4, 5, 6, 7, 4, 5, 6, 7, 4, 5]
    assert ix.drafts(old, 3) == lookup(old, 3, 3, 1)
    new = [9, 4, 8, 4]
    assert ix.drafts(new, 3) == lookup(new, 3, 3, 1) == [8, 4]
