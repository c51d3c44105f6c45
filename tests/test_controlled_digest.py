"""Forced acceptance's verify digest (synodic/spec/controlled.py: ControlledDrafter.verify_digest): the sum over
real rows of the target's own accepted count and a hash of its verify tokens and positions, accumulated on the
device by `decide`, so runs whose targets computed the same argmaxes compare equal and others do not."""
import torch

from synodic.spec.controlled import ControlledDrafter
from synodic.spec.runtime import Drafter

SLOTS, G = 4, 3


def _drafter():
    return ControlledDrafter(Drafter(), G, [0.8] * G, {0: list(range(10))}, 100, max_slots=SLOTS, max_len=16,
                             force=True)


def _step(d, slots, pos, m, tokens):
    return d.decide(torch.tensor(slots), torch.tensor(pos), torch.tensor(m), torch.tensor(tokens))


def test_digest_is_order_free_skips_padding_and_sees_every_token():
    rows = ([0, 1], [5, 7], [2, 0], [[1, 2, 3, 4], [5, 6, 7, 8]])
    a = _drafter()
    _step(a, *rows)
    b = _drafter()  # the same rows in another order, plus a padding row (the scratch slot)
    _step(b, [1, 0, SLOTS], [7, 5, 0], [0, 2, 3], [[5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]])
    assert a.verify_digest() == b.verify_digest() and a.verify_digest()["target_accepted"] == 2
    for change in ((0, 0), (1, 3)):  # one verify token of one row, anywhere in the window
        c = _drafter()
        toks = [list(t) for t in rows[3]]
        toks[change[0]][change[1]] += 1
        _step(c, rows[0], rows[1], rows[2], toks)
        assert c.verify_digest()["hash"] != a.verify_digest()["hash"]
    d = _drafter()  # the same tokens at another position
    _step(d, rows[0], [5, 8], rows[2], rows[3])
    assert d.verify_digest()["hash"] != a.verify_digest()["hash"]
    e = _drafter()  # the same tokens with another accepted count
    _step(e, rows[0], rows[1], [1, 0], rows[3])
    assert e.verify_digest() != a.verify_digest()


def test_unforced_drafters_have_no_digest():
    d = ControlledDrafter(Drafter(), G, [0.8] * G, {0: [1, 2]}, 100, max_slots=SLOTS, max_len=16)
    assert d.verify_digest() is None
