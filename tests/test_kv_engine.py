"""Top-k KV policies through the engine: identical logits and tokens across kv=resident (top-k),
kv=hisparse and kv=adaptive under hot-buffer misses and demotions; admission follows each policy's
device footprint; under memory pressure nothing crashes and every request finishes; verify windows
over adaptive and over hisparse (draft pages) reproduce plain greedy decoding."""
import torch

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

# tiny_mamba2 with three attention layers
MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*"]
TOPK = ["kv.top_k=4", "kv.block_size=2"]
TIERED = [*TOPK, "kv.hot_buffer=6", "kv.host_num_blocks=256", "kv.index_num_blocks=256"]
PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


def serve(overrides, prompts=PROMPTS, max_tokens=14, window=1, drafter=None, max_seq_len=64):
    cfg = compose([*MODEL, *overrides])
    eng = Engine(build_graph(cfg, max_seq_len=max_seq_len, window=window))
    reqs = [Request(i, p, SamplingParams(max_tokens=max_tokens)) for i, p in enumerate(prompts)]
    logits = []
    decode = eng.runner.decode

    def record(*a, **k):
        out = decode(*a, **k)
        logits.append(out.clone())
        return out
    eng.runner.decode = record
    eng.generate(reqs, drafter=drafter) if drafter else eng.generate(reqs)
    return eng, reqs, logits


def corrupting_drafter(ref: dict[int, list[int]], gamma: int = 2):
    """Drafter whose drafts are each request's reference continuation `ref[id]`, every third one corrupted."""
    def drafter(batch):
        out = []
        for r in batch:
            n = len(r.output_ids)
            d = [ref[r.id][n + j] if n + j < len(ref[r.id]) else 0 for j in range(gamma)]
            out.append([(t + 1) % 4096 if (n + j) % 3 == 0 else t for j, t in enumerate(d)])
        return out
    return drafter


def test_engine_outputs_bitwise_identical_across_policies():
    runs = {
        "resident": serve(["kv=resident", *TOPK, "kv.num_blocks=128"]),
        "hisparse": serve(["kv=hisparse", *TIERED, "kv.num_blocks=64"]),
        "adaptive": serve(["kv=adaptive", *TIERED, "kv.num_blocks=36", "kv.tail_pages=1"]),
    }
    _, ref, ref_logits = runs["resident"]
    assert all(r.finish_reason == "length" and r.preemptions == 0 for r in ref)
    for name in ("hisparse", "adaptive"):
        eng, reqs, logits = runs[name]
        assert [r.output_ids for r in reqs] == [r.output_ids for r in ref], name
        assert len(logits) == len(ref_logits) and all(torch.equal(a, b) for a, b in zip(logits, ref_logits)), name
    kv = {name: run[0].ledger.summary()["kv"] for name, run in runs.items()}
    assert kv["resident"]["host_fetched_rows"] == 0
    assert kv["hisparse"]["host_fetched_rows"] > kv["adaptive"]["host_fetched_rows"] > 0
    assert runs["adaptive"][0].graph.kv.stats["demoted_pages"] > 0
    per_step = runs["hisparse"][0].ledger.summary()["bytes_per_step"]
    for key in ("kv_h2d_bytes", "kv_d2h_bytes", "kv_device_bytes_per_request", "kv_miss_rate_layer2", "kv_running"):
        assert key in per_step


def test_admission_follows_device_footprint_and_nothing_is_lost():
    """Same device pool (24 pages of 2 tokens): resident fits ~2 long requests at a time, hisparse and
    adaptive admit all 6; every request finishes with its full output."""
    prompts = [[7 + i] * (20 + i) for i in range(6)]
    out = {}
    for name, ov in {"resident": ["kv=resident", *TOPK], "hisparse": ["kv=hisparse", *TIERED],
                     "adaptive": ["kv=adaptive", *TIERED, "kv.tail_pages=1"]}.items():
        eng, reqs, _ = serve([*ov, "kv.num_blocks=24", "runtime.max_slots=6"], prompts, max_tokens=6)
        assert all(r.finish_reason == "length" and len(r.output_ids) == 6 for r in reqs), name
        assert eng.scheduler.blocks.used() == 0 and len(eng.scheduler.free_slots) == 6
        out[name] = eng.graph.kv.stats["max_running"]
    assert out["resident"] <= 2 < out["hisparse"] == out["adaptive"] == 6


def test_verify_windows_over_adaptive_reproduce_greedy():
    plain_eng, plain, _ = serve(["kv=adaptive", *TIERED, "kv.num_blocks=40", "kv.tail_pages=2"], PROMPTS[:3])
    ref = {r.id: r.output_ids for r in plain}
    eng, reqs, _ = serve(["kv=adaptive", *TIERED, "kv.num_blocks=40", "kv.tail_pages=2"], PROMPTS[:3],
                         window=3, drafter=corrupting_drafter(ref))
    assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs]


def test_verify_windows_over_hisparse_reproduce_greedy():
    """Windows of 3 (drafts every third corrupted) over a hot buffer of 6 slots with misses: short rows whose
    window crosses B, long rows, rejected rows left behind; the same tokens as plain greedy decoding."""
    _, plain, _ = serve(["kv=resident", *TOPK, "kv.num_blocks=128"], PROMPTS)
    ref = {r.id: r.output_ids for r in plain}
    eng, reqs, _ = serve(["kv=hisparse", *TIERED, "kv.num_blocks=64", "kv.draft_pages=2"], PROMPTS,
                         window=3, drafter=corrupting_drafter(ref))
    assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs]
    assert eng.ledger.summary()["kv"]["host_fetched_rows"] > 0
    per_step = eng.ledger.summary()["bytes_per_step"]
    assert per_step["kv_draft_copy_bytes"] > 0  # window steps copy their first page's rows host -> draft
    assert per_step["kv_h2d_bytes"] >= per_step["kv_draft_copy_bytes"]
    kv = eng.graph.kv
    assert kv.device_bytes_held() >= (kv.S + 1) * kv.DP * kv.bs * kv.NL * kv.row_bytes()  # draft pages held


def test_window_limits_fail_at_build_with_one_line():
    import pytest

    from synodic.config.errors import ConfigError
    for ov, needle in ((["kv=hisparse", *TIERED], "kv.draft_pages=0 with a verify window of 4 tokens"),
                       (["kv=hisparse", *TIERED, "kv.draft_pages=2"], "expected kv.draft_pages >= 3"),
                       (["kv=adaptive", *TIERED, "kv.tail_pages=1"], "kv.tail_pages=1 with a verify window of 4")):
        with pytest.raises(ConfigError) as e:
            build_graph(compose([*MODEL, *ov]), max_seq_len=64, window=4)
        assert any(needle in line for line in e.value.lines)
