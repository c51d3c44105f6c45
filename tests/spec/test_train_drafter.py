"""Drafter training core: the loss falls on the target's own continuations, and acceptance is measured."""
import pytest
import torch

from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.spec.models import build_draft_model
from synodic.spec.training import continuations, greedy_acceptance, random_anchors, train_steps


@pytest.mark.parametrize("scheme", ["dflash", "dspark", "dflash2"])
def test_loss_falls_and_acceptance_is_reported(scheme):
    torch.manual_seed(0)
    target = random_model(PRESETS["tiny_gdn"], seed=0).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 4096, (6, 4), generator=g)
    data = torch.cat([continuations(target, prompts[:3], 20, 0.0), continuations(target, prompts[3:], 20, 1.0, g)])
    assert data.shape == (6, 24)
    draft = build_draft_model(scheme, target.config, target=target, num_layers=1, gamma=3, intermediate_size=128)
    hist = train_steps(draft, target, data, steps=25, batch=4, anchors_per_seq=6, gamma=3, lr=3e-3)
    first, last = sum(h["loss"] for h in hist[:3]) / 3, sum(h["loss"] for h in hist[-3:]) / 3
    assert last < first * 0.9, (first, last)
    acc = greedy_acceptance(draft, target, data[:3], random_anchors(3, 24, 5, 3, g, "cpu"), 3)
    assert 1.0 <= acc["acceptance_length"] <= 4.0 and len(acc["rate_by_position"]) == 3


def test_resume_equals_uninterrupted_run(tmp_path):
    target = random_model(PRESETS["tiny_gdn"], seed=0).eval()
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 4096, (4, 16), generator=g)

    def fresh():
        return build_draft_model("dflash", target.config, target=target, num_layers=1, gamma=3,
                                 intermediate_size=64, lookup_hint=2)
    kw = dict(steps=6, batch=2, anchors_per_seq=3, gamma=3, lr=3e-3)
    whole = fresh()
    h_whole = train_steps(whole, target, data, **kw)
    part = fresh()
    train_steps(part, target, data, **kw, ckpt_dir=tmp_path / "ck", ckpt_every=2, halt_at=4)  # "crashes" at 4
    resumed = fresh()  # a new process: fresh init, then the checkpoint
    h_res = train_steps(resumed, target, data, **kw, ckpt_dir=tmp_path / "ck", ckpt_every=2)
    assert [h["loss"] for h in h_res] == [h["loss"] for h in h_whole]
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("preset,scheme,ssm", [("tiny_mamba2", "dflash2", "replay"), ("tiny_gdn", "dspark", "eager")])
def test_walk_acceptance_equals_the_engines_tokens_per_step(preset, scheme, ssm):
    """walk_acceptance on held-out prompts and their greedy continuations gives the tokens per step the Engine
    measures serving those prompts with the shipped drafter (and the Engine emits those continuations)."""
    from synodic.config.compose import compose
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.graph import build_graph
    from synodic.models.weights import shipped_dir
    from synodic.spec.training import walk_acceptance
    P, new, gamma = 16, 19, 7
    ids = heldout_tokens(load_tokenizer(shipped_dir(preset) / "tokenizer.json").encode, 2000)
    prompts = torch.tensor([ids[i * 500: i * 500 + P] for i in range(3)])
    eng = Engine(build_graph(compose([f"model={preset}", "runtime.device=cpu", f"ssm={ssm}", f"spec={scheme}",
                                      f"spec.num_speculative_tokens={gamma}", "spec.gate=off"]),
                             max_seq_len=P + new + 16))
    held = continuations(eng.graph.model, prompts, new, 0.0)
    walk = walk_acceptance(eng.drafter.model, eng.graph.model, held, P, gamma)
    reqs = [Request(i, p.tolist(), SamplingParams(max_tokens=walk["max_tokens"])) for i, p in enumerate(prompts)]
    eng.generate(reqs)
    assert [r.output_ids for r in reqs] == held[:, P:P + walk["max_tokens"]].tolist()
    assert walk["steps"] == len(eng.accepted) and walk["tokens_per_step"] == sum(eng.accepted) / len(eng.accepted)
    assert walk["tokens_per_step"] > 1.0  # the shipped drafter gets drafts accepted on held-out text
