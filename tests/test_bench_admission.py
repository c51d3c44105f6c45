"""pipeline=bench at a device memory budget (pipeline.memory_budget): admission counts per configuration against
counts worked out by hand from tiny_mamba2's shapes, and the throughput row at that admission."""
import pytest
from synodic.pipelines.bench import BenchPipeline, admission, row_tokens, weights_bytes

from synodic.config.compose import compose
from synodic.graph import build_graph

# tiny_mamba2 (synodic/models/presets.py): 4 Mamba-2 layers (H 6, P 64, N 64, G 1, conv kernel 4), 2 attention
# layers (2 KV heads of 64), fp32 weights and states; ssm.ring_len 16; kv.block_size 16.
STATE = 6 * 64 * 64 * 4                        # one layer's full state
CONV = (6 * 64 + 2 * 1 * 64) * 3 * 4            # conv window: conv_dim x (kernel - 1)
RING = 6 * 16 * 64 * 4 + 6 * 16 * 4 + 16 * 64 * 4  # ring_x + ring_dt + ring_B, 16 positions
PAGE = 2 * 2 * 16 * 2 * 64 * 4                  # K and V of 16 tokens in both attention layers
EAGER = 4 * (STATE + CONV)
REPLAY = 4 * (STATE + RING + CONV) + 4          # + the shared int32 cursor (ssm.precision=fp32)
DUAL = REPLAY + 4 * STATE // 2                  # + the bf16 copy (ssm.precision=dual_bf16, the default)
EAGER_SPEC = 4 * (4 * STATE + CONV)             # 1 + γ states per layer, γ = 3
BUDGET_OVER_WEIGHTS = 10 * 2**20

# prompt_len 4, stagger 0, warmup 1, steps 2: a plain row holds 4 + 5 = 9 tokens (1 page), a γ = 3 row
# 4 + 5 x 4 = 24 (2 pages)
CASES = [
    ([], EAGER, PAGE, 10 * 2**20 // (EAGER + PAGE)),                                   # 23
    (["ssm=replay", "ssm.precision=fp32"], REPLAY, PAGE, 10 * 2**20 // (REPLAY + PAGE)),  # 18
    (["ssm=replay"], DUAL, PAGE, 13),
    (["spec=ngram", "spec.num_speculative_tokens=3"], EAGER_SPEC, 2 * PAGE, 6),
    (["ssm=replay", "ssm.precision=fp32", "spec=ngram", "spec.num_speculative_tokens=3"], REPLAY, 2 * PAGE, 17),
    (["ssm=replay", "spec=ngram", "spec.num_speculative_tokens=3"], DUAL, 2 * PAGE, 13),
]


@pytest.mark.parametrize("over,ssm,kv,admitted", CASES)
def test_admission_counts_match_hand_computed(over, ssm, kv, admitted):
    p = BenchPipeline(batch_sizes=[1], prompt_len=4, steps=2, warmup=1, stagger=0, repeats=1)
    cfg = compose(["model=tiny_mamba2", "model.weights=random", "runtime.device=cpu"] + over)
    graph = build_graph(cfg, row_tokens(p, cfg.spec.window) + 1, max_slots=2)
    p = p.model_copy(update={"memory_budget": weights_bytes(graph) + BUDGET_OVER_WEIGHTS})
    a = admission(graph, p)
    assert a["request_bytes"] == {"ssm": ssm, "kv": kv}
    assert a["admitted"] == admitted == BUDGET_OVER_WEIGHTS // (ssm + kv)
    distinct = {t.data_ptr(): t for t in graph.model.state_dict().values()}.values()  # the tied head once
    assert weights_bytes(graph) == sum(t.numel() * 4 for t in distinct)


def test_bench_times_the_admitted_batch(tmp_path):
    from synodic.pipelines.bench import run
    over = ["pipeline=bench", "model=tiny_mamba2", "model.weights=random", "runtime.device=cpu", "ssm=replay",
            "ssm.precision=fp32", "runtime.max_slots=2", "pipeline.batch_sizes=[1]", "pipeline.prompt_len=4",
            "pipeline.steps=2", "pipeline.warmup=1", "pipeline.stagger=0", "pipeline.repeats=1"]
    w = weights_bytes(build_graph(compose(over), 16, max_slots=1))
    cfg = compose(over + [f"pipeline.memory_budget={w + 3 * (REPLAY + PAGE) + 100}"])  # 3 requests fit, not 4
    out = run(cfg, tmp_path)
    (adm,) = out["admission"]
    assert adm["admitted"] == 3 and adm["batch_timed"] == 3 and adm["tokens_per_s"] > 0
    at = [r for r in out["bench"] if r.get("memory_budget")]
    assert [r["batch"] for r in at] == [3] and at[0]["admitted"] == 3
    assert "admitted" in (tmp_path / "admission.md").read_text()
