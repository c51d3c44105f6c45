"""Speculative decoding through the Engine: greedy output equals plain greedy decoding token for token
(spec=ngram over every state backend x KV policy, quantized and shipped models on a diagonal), with requests
finishing mid-window, stop tokens inside a window, preemption during speculation and replay ring wrap-around;
seeded sampling reproducible; bad spec input fails with one line, exit 2."""
import subprocess
import sys
from pathlib import Path

import pytest

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

ROOT = Path(__file__).resolve().parents[2]
# tiny_mamba2 with three attention layers, random weights (as tests/test_kv_engine.py)
MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*"]
TOPK = ["kv.top_k=4", "kv.block_size=2"]
TIERED = [*TOPK, "kv.hot_buffer=6", "kv.host_num_blocks=256", "kv.index_num_blocks=256"]
KV = {"resident": ["kv=resident", "kv.num_blocks=128"],
      "hisparse": ["kv=hisparse", *TIERED, "kv.num_blocks=64", "kv.draft_pages=3"],
      "adaptive": ["kv=adaptive", *TIERED, "kv.num_blocks=40", "kv.tail_pages=3"]}
SSM = {"eager": ["ssm=eager"], "replay": ["ssm=replay", "ssm.ring_len=8"]}  # ring of 8: windows wrap it
PROMPTS = [[5, 9, 200, 31, 7, 5, 9], [100, 3], [42] * 9, [1, 2, 3, 1, 2, 3, 1, 2]]
# spec.gate=off: these tests are about the drafting steps themselves; tests/spec/test_gate.py runs the gate
SPEC = ["spec=ngram", "spec.num_speculative_tokens=3", "spec.gate=off"]


def serve(overrides, max_tokens=(13, 9, 16, 11), stop=(), temperature=0.0, prompts=PROMPTS, max_seq_len=64):
    eng = Engine(build_graph(compose(overrides), max_seq_len=max_seq_len))
    reqs = [Request(i, p, SamplingParams(max_tokens=n, temperature=temperature, seed=7 + i, stop_token_ids=stop))
            for i, (p, n) in enumerate(zip(prompts, max_tokens))]
    eng.generate(reqs)
    return eng, reqs


@pytest.mark.parametrize("kv", list(KV))
def test_ngram_greedy_equals_plain_greedy(kv):
    _, plain = serve([*MODEL, *KV[kv]])
    ref = [r.output_ids for r in plain]
    for ssm in SSM.values():
        eng, reqs = serve([*MODEL, *KV[kv], *ssm, *SPEC])
        assert [r.output_ids for r in reqs] == ref, (kv, ssm)
        s = eng.spec_stats.summary()
        assert s["accepted_tokens"] > 0 and s["emitted_tokens"] == sum(map(len, ref)) - len(ref)  # + prefill's tokens
        assert [r.finish_reason for r in reqs] == [r.finish_reason for r in plain]


@pytest.mark.parametrize("preset,ssm,quant", [("tiny_mamba2", "replay", "mxfp4"), ("tiny_gdn", "eager", "mxfp4"),
                                              ("tiny_gdn", "replay", "none")])
def test_ngram_greedy_on_shipped_models(preset, ssm, quant):
    base = [f"model={preset}", "runtime.device=cpu", f"quant={quant}"]
    _, plain = serve(base, max_tokens=(10, 7, 12, 9))
    eng, reqs = serve([*base, *SSM[ssm], *SPEC], max_tokens=(10, 7, 12, 9))
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]


def test_stop_token_inside_a_window():
    _, plain = serve([*MODEL, *KV["resident"]])
    stop = plain[2].output_ids[5]  # a token the row emits mid-output: some window holds it before its end
    _, p2 = serve([*MODEL, *KV["resident"]], stop=(stop,))
    eng, reqs = serve([*MODEL, *KV["resident"], *SSM["replay"], *SPEC], stop=(stop,))
    assert [r.output_ids for r in reqs] == [r.output_ids for r in p2]
    assert any(r.finish_reason == "stop" for r in reqs)


def test_preemption_during_speculation():
    """A pool of 14 pages of 2 tokens for 4 requests: windows find pages short (plain verify steps), the
    scheduler preempts and recomputes; the tokens are still plain greedy decoding's."""
    kv = ["kv=resident", "kv.block_size=2", "kv.num_blocks=14"]
    _, plain = serve([*MODEL, *kv])
    eng, reqs = serve([*MODEL, *kv, *SSM["replay"], *SPEC])
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    assert sum(r.preemptions for r in reqs) > 0
    assert eng.scheduler.blocks.used() == 0


def test_seeded_sampling_is_reproducible_and_counts_add_up():
    runs = [serve([*MODEL, *KV["resident"], *SSM["replay"], *SPEC], temperature=1.0) for _ in range(2)]
    (e1, a), (_, b) = runs
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [len(r.output_ids) for r in a] == [13, 9, 16, 11]
    s = e1.spec_stats.summary()
    assert s["emitted_tokens"] == sum(len(r.output_ids) for r in a) - len(a)  # the first token is prefill's
    assert 1.0 <= (s["mean_acceptance_length"] or 1.0) <= 4.0


def test_rollback_check():
    from synodic.graph import check_rollback
    from synodic.ssm.base import StateBackend

    class NoRollback(StateBackend):
        def __init__(self):
            pass

    class G:
        ssm = NoRollback()
    cfg = compose(["spec=ngram"])
    with pytest.raises(ConfigError, match="rolls back"):
        check_rollback(G, cfg, 8)
    check_rollback(G, cfg, 1)


@pytest.mark.parametrize("args,needle", [
    (["spec=ngram", "spec.num_speculative_tokens=0"], "spec.num_speculative_tokens=0"),
    (["spec=ngram", "ssm=replay", "spec.num_speculative_tokens=16"],
     "spec.num_speculative_tokens=16 with ssm.ring_len=16"),
    (["spec=ngram", "spec.num_speculative_tokens=7", "kv=hisparse"],
     "kv.draft_pages=0 with a verify window of 8 tokens"),
    (["spec=dflash", "spec.drafter=/nonexistent/drafter"], "spec"),
])
def test_bad_spec_input_one_line_exit_2(args, needle, tmp_path):
    p = subprocess.run([sys.executable, "run.py", "runtime.device=cpu", f"hydra.run.dir={tmp_path}", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


NEURAL = ["spec.drafter=random", "spec.num_speculative_tokens=3", "spec.gate=off"]


@pytest.mark.parametrize("scheme,ssm,kv", [("dflash", "eager", "adaptive"), ("dspark", "replay", "adaptive"),
                                           ("dflash2", "replay", "resident")])
def test_neural_greedy_equals_plain_greedy(scheme, ssm, kv):
    """Draft models (seeded random weights) over a diagonal of state backends x KV policies."""
    _, plain = serve([*MODEL, *KV[kv]])
    eng, reqs = serve([*MODEL, *KV[kv], *SSM[ssm], f"spec={scheme}", *NEURAL])
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    per_step = eng.ledger.summary()["bytes_per_step"]
    assert per_step["draft_kv"] > 0 and per_step["draft_weights_read"] > 0


@pytest.mark.parametrize("preset,scheme,quant", [("tiny_gdn", "dflash2", "mxfp4"), ("tiny_mamba2", "dspark", "none")])
def test_neural_greedy_on_shipped_targets(preset, scheme, quant):
    base = [f"model={preset}", "runtime.device=cpu", f"quant={quant}"]
    _, plain = serve(base, max_tokens=(8, 6, 9, 7))
    _, reqs = serve([*base, *SSM["replay"], f"spec={scheme}", *NEURAL], max_tokens=(8, 6, 9, 7))
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]


def test_drafter_for_another_target_fails_with_one_line(tmp_path):
    from synodic.models.presets import PRESETS
    from synodic.spec.models import build_draft_model, save_draft_model
    save_draft_model(build_draft_model("dflash", PRESETS["tiny_mamba2"]), tmp_path / "d")
    cfg = compose([*MODEL, "+model.overrides.vocab_size=2048", "spec=dflash", f"spec.drafter={tmp_path / 'd'}"])
    with pytest.raises(ConfigError) as e:
        build_graph(cfg, max_seq_len=32)
    assert len(e.value.lines) == 1 and "vocab_size=4096" in e.value.lines[0], e.value.lines


@pytest.mark.parametrize("preset,ssm", [("tiny_mamba2", "replay"), ("tiny_gdn", "eager")])
def test_shipped_dflash2_drafter_is_lossless_and_accepts(preset, ssm):
    """spec.drafter=auto loads the trained dflash2 drafter shipped for the target: greedy output unchanged,
    and it gets drafts accepted (a random drafter's acceptance length stays at 1.0 on real text)."""
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    from synodic.models.weights import shipped_dir
    ids = heldout_tokens(load_tokenizer(shipped_dir(preset) / "tokenizer.json").encode, 800)
    text = [ids[i * 200: i * 200 + 40] for i in range(4)]  # held-out source code, as the drafter was trained on
    base = [f"model={preset}", "runtime.device=cpu"]
    _, plain = serve(base, max_tokens=(16, 16, 16, 16), prompts=text, max_seq_len=96)
    eng, reqs = serve([*base, *SSM[ssm], "spec=dflash2", "spec.gate=off"], max_tokens=(16, 16, 16, 16), prompts=text,
                      max_seq_len=96)
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    assert sum(eng.accepted) / len(eng.accepted) > 1.05


def _counted(overrides, prompts, max_tokens):
    """serve() that also records the runner's plain decode calls and each window's real drafts per row."""
    eng = Engine(build_graph(compose(overrides), max_seq_len=64))
    calls = {"decode": 0, "window": []}
    decode, speculate = eng.runner.decode, eng.runner.speculate

    def counted_decode(*a, **k):
        calls["decode"] += 1
        return decode(*a, **k)

    def counted_speculate(drafter, slots, positions, anchors, gamma, max_len, drafts, n_drafts):
        calls["window"].append(list(n_drafts))
        return speculate(drafter, slots, positions, anchors, gamma, max_len, drafts, n_drafts)
    eng.runner.decode, eng.runner.speculate = counted_decode, counted_speculate
    reqs = [Request(i, p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, max_tokens))]
    eng.generate(reqs)
    return eng, reqs, calls


@pytest.mark.parametrize("kv", list(KV))
def test_steps_without_drafts_run_the_plain_decode_step(kv):
    """Prompts without repeats: at first no row has an n-gram match, so those steps run the plain decode step
    (no 1 + γ window of padding) and are counted; steps where some row drafts keep the window. Output ==
    plain greedy over both state backends and every KV policy (plain steps between verify windows). Steps queued
    from host tokens only: an overlapped step drafts on the device, where nobody knows in time that no row has
    a draft (test_overlapped_speculation_equals_synced_steps)."""
    prompts, max_tokens = [[11, 12, 13, 14, 15, 16], [300, 301, 302], [7, 8, 9, 10, 20, 21, 22, 23]], (12, 12, 12)
    _, plain = serve([*MODEL, *KV[kv]], prompts=prompts, max_tokens=max_tokens)
    for ssm in SSM.values():
        eng, reqs, calls = _counted([*MODEL, *KV[kv], *ssm, *SPEC, "runtime.overlap=false"], prompts, max_tokens)
        assert [r.output_ids for r in reqs] == [r.output_ids for r in plain], ssm
        s = eng.spec_stats.summary()
        assert s["plain_steps"] == calls["decode"] > 0, (s, calls)
        assert s["steps"] == s["plain_steps"] + len(calls["window"])
        assert calls["window"] and all(any(n) for n in calls["window"])  # windows only where some row drafts
        assert any(0 in n for n in calls["window"])  # a mixed batch (rows without drafts) kept its window
        assert s["emitted_tokens"] == sum(map(len, (r.output_ids for r in plain))) - len(plain)


@pytest.mark.parametrize("preset,spec", [("tiny_mamba2", "ngram"), ("tiny_mamba2", "dflash2"), ("tiny_gdn", "dspark")])
def test_overlapped_speculation_equals_synced_steps(preset, spec):
    """runtime.overlap queues a greedy speculative step behind the one in flight (anchors and positions from its
    result on the device, drafts from the runner's token history and the drafter's ring): the same drafts as
    steps queued from host tokens, so the same outputs and the same accepted count at every row-step, with
    requests finishing by length and by a stop token inside a chain (their queued step's tokens dropped)."""
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    from synodic.models.weights import shipped_dir
    ids = heldout_tokens(load_tokenizer(shipped_dir(preset) / "tokenizer.json").encode, 800)
    prompts = [ids[i * 150: i * 150 + 24 + 5 * i] for i in range(4)]
    base = [f"model={preset}", "runtime.device=cpu", "ssm=replay", "ssm.ring_len=8", f"spec={spec}",
            "spec.num_speculative_tokens=3", "spec.gate=off"]
    _, plain = serve(base[:2], max_tokens=(24, 17, 30, 9), prompts=prompts, max_seq_len=96)
    stop = (plain[2].output_ids[11],)  # request 2 ends on it, inside a chain
    runs = {}
    for overlap in ("false", "true"):
        eng, reqs = serve([*base, f"runtime.overlap={overlap}"], max_tokens=(24, 17, 30, 9), prompts=prompts,
                          max_seq_len=96, stop=stop)
        runs[overlap] = (eng, [r.output_ids for r in reqs], [r.finish_reason for r in reqs])
    (synced, out_s, why_s), (chained, out_c, why_c) = runs["false"], runs["true"]
    assert out_c == out_s and why_c == why_s and "stop" in why_c and "length" in why_c
    assert out_s[0] == plain[0].output_ids and out_s[1] == plain[1].output_ids
    assert chained.accepted == synced.accepted and sum(chained.accepted) > len(chained.accepted)
    assert chained.overlapped_steps > 0 and synced.overlapped_steps == 0
    assert chained.spec_stats.summary()["drafted_tokens"] == synced.spec_stats.summary()["drafted_tokens"] > 0


@pytest.mark.parametrize("kv", list(KV))
def test_overlapped_speculation_under_every_kv_policy(kv):
    """Windows queued behind the one in flight under each KV policy (hisparse's and adaptive's host pools under
    pressure: pages for the queued window only from free pages): the same outputs and accepted counts as synced
    steps, and equal to plain greedy decoding."""
    max_tokens = (30, 26, 34, 28)
    _, plain = serve([*MODEL, *KV[kv]], max_tokens=max_tokens)
    runs = {}
    for overlap in ("false", "true"):
        eng, reqs = serve([*MODEL, *KV[kv], *SSM["replay"], *SPEC, f"runtime.overlap={overlap}"], max_tokens=max_tokens)
        runs[overlap] = (eng, [r.output_ids for r in reqs])
    assert runs["true"][1] == runs["false"][1] == [r.output_ids for r in plain]
    assert runs["true"][0].accepted == runs["false"][0].accepted
    assert runs["true"][0].overlapped_steps > 0 and runs["false"][0].overlapped_steps == 0


@pytest.mark.parametrize("scheme", ["ngram", "dflash2"])
def test_a_reused_request_id_drafts_as_a_fresh_one(scheme):
    """Request ids repeat (a benchmark's measured round after its warm-up, a client's counter): the second
    request under an id gets the same drafts, so the same accepted counts, as the first (the n-gram index of the
    prompt lookup, spec=ngram's and the shipped neural drafters' hints, is per request, not per id)."""
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    from synodic.models.weights import shipped_dir
    ids = heldout_tokens(load_tokenizer(shipped_dir("tiny_mamba2") / "tokenizer.json").encode, 800)
    prompts = [ids[i * 200: i * 200 + 40] for i in range(3)]
    eng = Engine(build_graph(compose(["model=tiny_mamba2", "runtime.device=cpu", f"spec={scheme}", "spec.gate=off"]),
                             max_seq_len=96))
    runs = []
    for _ in range(2):
        reqs = [Request(i, list(p), SamplingParams(max_tokens=24)) for i, p in enumerate(prompts)]
        eng.generate(reqs)
        runs.append(([r.output_ids for r in reqs], list(eng.accepted)))
    assert runs[0] == runs[1]
    assert max(runs[0][1]) > 1  # something was accepted, so the drafts mattered
