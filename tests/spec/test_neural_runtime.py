"""The engine side of draft-model speculation (synodic.spec.runtime.NeuralDrafter) with a recording stand-in
for a DraftModel: every propose() finds exactly the committed positions 0..anchor-1 in the drafter's context,
holding the target's hidden states of those tokens (checked against a full forward with hidden_layers); greedy
output still equals plain greedy decoding, and sampled drafts with their q run the sampling rule."""
from types import SimpleNamespace

import torch

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph
from synodic.spec.runtime import NeuralDrafter

MODEL = ["model.weights=random", "runtime.device=cpu", "+model.overrides.num_hidden_layers=6",
         "+model.overrides.hybrid_override_pattern=M*-*M*", "kv.block_size=4", "ssm=replay", "ssm.ring_len=8"]
PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9]
GAMMA = 3


class RecordingDraft(torch.nn.Module):
    scheme, target_layers, gamma = "dflash", (1, 4), GAMMA

    def __init__(self, engine, reference, V):
        super().__init__()
        self.engine, self.reference, self.V = engine, reference, V
        self.proj = torch.nn.Linear(4, 4, bias=False)  # something for the ledger to count
        self.ctx: dict[int, dict[int, torch.Tensor]] = {}
        self.proposals = 0

    def allocate(self, max_slots, context_window, device, dtype):
        pass

    def reset(self, slots):
        for s in slots.tolist():
            self.ctx[s] = {}

    def append_context(self, slots, hidden, positions, valid):
        for b, s in enumerate(slots.tolist()):
            for t in range(hidden.shape[1]):
                if valid[b, t]:
                    self.ctx[s][int(positions[b, t])] = hidden[b, t].clone()

    def propose(self, slots, anchors, positions, gamma, temperature, generator):
        model = self.engine.graph.model
        drafts, q = [], []
        for s, pos in zip(slots.tolist(), positions.tolist()):
            r = next(r for r in self.engine.scheduler.running if r.slot == s)
            assert sorted(self.ctx[s]) == list(range(pos)), (s, pos, sorted(self.ctx[s]))
            # greedy steps may be queued before the host has the step in flight's tokens (overlapped speculation):
            # their context is the prompt and the plain greedy output, which the engine must reproduce
            ref = self.reference[r.id]
            context = r.context if r.params.temperature > 0 else r.prompt_ids + ref
            _, hidden = model(torch.tensor([context[:pos]]), hidden_layers=self.target_layers)
            got = torch.stack([self.ctx[s][j] for j in range(pos)])
            torch.testing.assert_close(got, hidden[0], rtol=1e-4, atol=1e-4)
            n = pos + 1 - len(r.prompt_ids)  # outputs up to the anchor
            d = [ref[n + j] if n + j < len(ref) else 0 for j in range(gamma)]
            drafts.append([(t + 1) % self.V if (n + j) % 3 == 0 else t for j, t in enumerate(d)])
            q.append(torch.softmax(torch.randn(gamma, self.V, generator=torch.Generator().manual_seed(pos)), -1))
        self.proposals += 1
        q = torch.stack(q)
        drafts = torch.tensor(drafts)
        # sampling rows draw their drafts from q, as a real drafter does (temperature None: every row greedy)
        sampled = temperature > 0 if temperature is not None else torch.zeros(len(drafts), dtype=torch.bool)
        if sampled.any():
            drafts[sampled] = torch.multinomial(q[sampled].view(-1, self.V), 1, generator=generator).view(-1, gamma)
        return drafts, (q if sampled.any() else None)


def _serve(temperature=0.0, reference=None):
    eng = Engine(build_graph(compose(MODEL), max_seq_len=64, window=GAMMA + 1))
    if reference is not None:
        draft = RecordingDraft(eng, reference, eng.graph.model.config.vocab_size)
        cfg = SimpleNamespace(num_speculative_tokens=GAMMA, context_window=64, drafter="test", gate="off")
        eng._use_drafter(NeuralDrafter(draft, cfg, "cpu"), GAMMA)
    reqs = [Request(i, p, SamplingParams(max_tokens=12, temperature=temperature, seed=i))
            for i, p in enumerate(PROMPTS)]
    eng.generate(reqs)
    return eng, reqs


def test_neural_runtime_context_and_greedy_output():
    _, plain = _serve()
    ref = {r.id: r.output_ids for r in plain}
    eng, reqs = _serve(reference=ref)
    assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs]
    assert eng.drafter.model.proposals > 0
    s = eng.spec_stats.summary()
    assert s["accepted_tokens"] > 0 and s["mean_acceptance_length"] > 1.0
    per_step = eng.ledger.summary()["bytes_per_step"]
    assert per_step["draft_weights_read"] > 0


def test_neural_runtime_sampled_rows():
    _, plain = _serve()
    ref = {r.id: r.output_ids for r in plain}
    eng, reqs = _serve(temperature=1.0, reference=ref)
    assert all(len(r.output_ids) == 12 for r in reqs)
    assert eng.spec_stats.summary()["steps"] > 0
