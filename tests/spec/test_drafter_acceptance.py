"""Teacher-forced acceptance of spec=ngram (the baseline of BENCHMARKS S1) and the held-out blocks every scheme is
scored on: ngram's runs are prompt lookup against the target's argmax, its walk is what the Engine measures, its
sampled acceptance is the one-hot q rule, and benchmarks.drafter_acceptance scores the recipe's own blocks."""
import json

import pytest
import torch
import torch.nn.functional as F

from synodic.spec.ngram import lookup
from synodic.spec.training import ngram_runs, ngram_sampled_acceptance, runs_acceptance, walk_runs


class NextToken(torch.nn.Module):
    """A 'target' whose argmax at position t is tokens[t + 1] (the sequence is its own greedy continuation)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
        return F.one_hot(nxt, self.vocab).float()


class Uniform(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab)


def test_ngram_runs_are_the_lookup_matched_against_the_targets_argmax():
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 6, (3, 12), generator=g)
    tokens = torch.cat([base, base[:, :10]], dim=1)  # a repeat: long lookups match part of the way
    gamma, anchors = 5, torch.tensor([[3, 12, 15], [11, 13, 16], [0, 14, 9]])
    runs = ngram_runs(NextToken(6), tokens, anchors, gamma, 4, 1)
    for i, (b, a) in enumerate([(r, int(x)) for r in range(3) for x in anchors[r]]):
        d = lookup(tokens[b, :a + 1].tolist(), gamma, 4, 1)
        truth = tokens[b, a + 1:a + 1 + gamma].tolist()
        n = 0
        while n < len(d) and n < len(truth) and d[n] == truth[n]:
            n += 1
        assert runs[i].tolist() == [1] * n + [0] * (gamma - n), (b, a, d, truth)
    assert runs.sum() > 0  # the repeat gives matches


def test_ngram_without_a_match_keeps_only_the_target_token():
    tokens = torch.arange(10)[None]  # no token repeats: no lookup ever matches
    runs = ngram_runs(NextToken(10), tokens, torch.tensor([[2, 5]]), 3, 4, 1)
    assert runs.sum() == 0
    acc = runs_acceptance(runs)
    assert acc["acceptance_length"] == 1.0


def test_ngram_sampled_acceptance_is_the_target_probability_of_each_draft():
    """q one-hot: draft k is kept with probability p(d_k); uniform p over V gives 1 + sum_k V^-k over the drafts the
    lookup has (none past its end)."""
    V, gamma = 8, 4
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 5, 6]])
    anchors = torch.tensor([[6, 7]])  # lookups of 3 drafts each: the context ends before a fourth
    acc = ngram_sampled_acceptance(Uniform(V), tokens, anchors, gamma, 4, 1)
    lens = [len(lookup(tokens[0, :a + 1].tolist(), gamma, 4, 1)) for a in (6, 7)]
    want = sum(1 + sum(V ** -k for k in range(1, n + 1)) for n in lens) / 2
    assert acc["acceptance_length"] == pytest.approx(want)
    assert lens == [3, 3]  # (shorter than gamma: position 4 is never kept)


def test_the_ngram_walk_is_the_engines_tokens_per_step():
    """walk_runs over ngram's runs at every anchor gives the tokens per step the Engine measures serving spec=ngram
    on the same prompts (every step drafting), and the Engine emits the target's greedy continuation."""
    from synodic.config.compose import compose
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.graph import build_graph
    from synodic.models.weights import shipped_dir
    from synodic.spec.training import continuations, walk_anchors
    P, new, gamma = 16, 23, 4
    ids = heldout_tokens(load_tokenizer(shipped_dir("tiny_mamba2") / "tokenizer.json").encode, 2000)
    prompts = torch.tensor([ids[i * 500: i * 500 + P] for i in range(3)])
    eng = Engine(build_graph(compose(["model=tiny_mamba2", "runtime.device=cpu", "ssm=replay", "spec=ngram",
                                      f"spec.num_speculative_tokens={gamma}", "spec.gate=off"]),
                             max_seq_len=P + new + 16))
    target = eng.graph.model
    held = continuations(target, prompts, new, 0.0)
    wa = walk_anchors(held, P, gamma)
    walk = walk_runs(ngram_runs(target, held, wa, gamma, 4, 1).view(*wa.shape, gamma), P, held.shape[1], gamma)
    reqs = [Request(i, p.tolist(), SamplingParams(max_tokens=walk["max_tokens"])) for i, p in enumerate(prompts)]
    eng.generate(reqs)
    assert [r.output_ids for r in reqs] == held[:, P:P + walk["max_tokens"]].tolist()
    assert walk["steps"] == len(eng.accepted) and walk["tokens_per_step"] == sum(eng.accepted) / len(eng.accepted)
    assert walk["tokens_per_step"] > 1.0


def test_heldout_data_is_the_training_runs_held_out_data(tmp_path):
    """benchmarks.drafter_acceptance scores the very sequences a train_drafter run with the same recipe reports on,
    without making that run's training continuations."""
    from synodic.pipelines.train_drafter import _data, heldout_data

    from synodic.config.compose import compose
    from synodic.data.tokenizer import load_tokenizer
    from synodic.graph import DTYPES, load_model
    from synodic.models.weights import shipped_dir
    cfg = compose(["model=tiny_mamba2", "pipeline=train_drafter", "spec=dspark", "pipeline.prompts=3",
                   "pipeline.eval_prompts=2", "pipeline.new_tokens=9", "pipeline.prompt_len=8"])
    target, _ = load_model(cfg.model, "cpu", DTYPES[cfg.model.dtype])
    tok = load_tokenizer(shipped_dir("tiny_mamba2") / "tokenizer.json")
    _, held, held_s = _data(target, tok, cfg.pipeline, "cpu", tmp_path, "tiny_mamba2")
    h, hs, anchors = heldout_data(target, tok, cfg.pipeline, "cpu", 7)
    assert torch.equal(h, held) and torch.equal(hs, held_s)
    assert anchors.shape == (2, 16) and anchors.min() >= 7 and anchors.max() < held.shape[1] - 7


def test_benchmark_scores_every_scheme_on_one_set_of_blocks(tmp_path):
    from benchmarks import drafter_acceptance
    out = tmp_path / "da.json"
    drafter_acceptance.main(["--models", "tiny_gdn", "--schemes", "ngram", "dflash", "--prompts", "2",
                             "--out", str(out)])
    r = json.loads(out.read_text())
    assert [x["scheme"] for x in r["rows"]] == ["ngram", "dflash"] and r["gamma"] == 7
    for x in r["rows"]:
        assert 1.0 <= x["acceptance_length"] <= 8.0 and 1.0 <= x["sampled_acceptance_length"] <= 8.0
        assert len(x["rate_by_position"]) == 7
    ngram, dflash = r["rows"]
    assert r["ratios"] == {"tiny_gdn": {
        "greedy": {"dflash/ngram": pytest.approx(dflash["acceptance_length"] / ngram["acceptance_length"])},
        "walk": {"dflash/ngram": pytest.approx(dflash["walk_tokens_per_step"] / ngram["walk_tokens_per_step"])}}}
