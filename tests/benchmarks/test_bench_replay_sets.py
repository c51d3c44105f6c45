"""bench_replay's slot-set count: the 2x-L2 rule, a model's layer count (--sets), and the memory cap."""
from benchmarks.replay import SETS_STATE_BYTES, GDNCase, MambaCase, _rot

MAMBA_SLOT = 128 * 64 * 128 * 4  # fp32 state bytes of one Mamba-2 slot (H, P, N of the bench)


def test_rule_only_by_default():
    assert _rot(MambaCase, 256) == 1        # 1.07 GB of state > 2x L2
    assert _rot(GDNCase, 1) > 24            # a small batch needs many sets to leave L2


def test_sets_raise_the_count_up_to_the_cap():
    assert _rot(MambaCase, 256, 24) == 24
    assert _rot(GDNCase, 1, 24) == _rot(GDNCase, 1)   # the rule already asks for more
    capped = _rot(MambaCase, 512, 24)
    assert capped == SETS_STATE_BYTES // (512 * MAMBA_SLOT) < 24
