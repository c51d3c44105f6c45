"""Every request that fits the KV pool is served: over random pool sizes, prompt and output lengths and
every KV policy, each request either produces all its tokens or is larger than the whole pool (only
then may it end with kv_capacity / rejected_kv_capacity)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=3",
         "+model.overrides.hybrid_override_pattern=M*-", "+model.overrides.hidden_size=32",
         "+model.overrides.intermediate_size=64", "+model.overrides.mamba_num_heads=2",
         "+model.overrides.mamba_head_dim=16", "+model.overrides.ssm_state_size=16",
         "+model.overrides.num_attention_heads=2", "+model.overrides.num_key_value_heads=1",
         "+model.overrides.head_dim=16"]
TIERED = ["kv.top_k=2", "kv.block_size=2", "kv.hot_buffer=4", "kv.host_num_blocks=48", "kv.index_num_blocks=48"]
POLICIES = {"resident": ["kv=resident", "kv.block_size=2"],
            "resident_topk": ["kv=resident", "kv.block_size=2", "kv.top_k=2"],
            "hisparse": ["kv=hisparse", *TIERED],
            "adaptive": ["kv=adaptive", *TIERED, "kv.tail_pages=1"]}
_GRAPHS: dict = {}


def _engine(policy: str, num_blocks: int, slots: int) -> Engine:
    key = (policy, num_blocks, slots)
    if key not in _GRAPHS:
        cfg = compose([*MODEL, *POLICIES[policy], f"kv.num_blocks={num_blocks}", f"runtime.max_slots={slots}"])
        _GRAPHS[key] = cfg
    return Engine(build_graph(_GRAPHS[key], max_seq_len=64))


requests = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=5)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(sorted(POLICIES)), num_blocks=st.integers(3, 20), slots=st.integers(1, 4),
       reqs=requests)
def test_each_request_completes_or_exceeds_the_pool(policy, num_blocks, slots, reqs):
    eng = _engine(policy, num_blocks, slots)
    rs = [Request(i, [(7 * i + j) % 250 + 1 for j in range(p)], SamplingParams(max_tokens=m))
          for i, (p, m) in enumerate(reqs)]
    eng.generate(rs)
    sched = eng.scheduler
    b = sched.blocks
    # the policy's own page arithmetic (adaptive also needs host and index pages) decides "larger than the pool"
    limit = max(n for n in range(1, 200) if sched._fits_ever(n))
    for r, (p, m) in zip(rs, reqs):
        assert r.done, (policy, r)
        if r.finish_reason == "length":
            assert len(r.output_ids) == m
        elif r.finish_reason == "rejected_kv_capacity":
            assert p + 1 > limit and not r.output_ids, (policy, num_blocks, p, m, limit)
        else:
            assert r.finish_reason == "kv_capacity" and p + m > limit, (policy, num_blocks, p, m, limit, r)
    assert b.used() == 0 and len(eng.scheduler.free_slots) == slots


def test_lone_request_ending_with_kv_capacity_does_not_reject_the_queue():
    """The reported case: a request that outgrows the pool ends, and the ones waiting behind it run."""
    eng = _engine("resident", 8, 1)
    rs = [Request(0, [3] * 4, SamplingParams(max_tokens=100)), Request(1, [4] * 4, SamplingParams(max_tokens=3)),
          Request(2, [5] * 4, SamplingParams(max_tokens=3))]
    eng.generate(rs)
    assert rs[0].finish_reason == "kv_capacity" and len(rs[0].output_ids) > 0
    assert [r.finish_reason for r in rs[1:]] == ["length", "length"]
