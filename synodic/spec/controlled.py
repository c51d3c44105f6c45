"""Controlled acceptance for benchmarks (pipeline=bench pipeline.acceptance=controlled): a drafter wrapper that
runs the real drafter (its whole cost: propose, context updates, ledger entry) and then replaces its proposals
with the target's own greedy continuation, rejected at chosen per-position rates.

Random-weight presets accept nothing, so a speculative step at real shapes would otherwise time only
one-token verifies. Here the drafts of a row whose output holds n tokens are ref[n], ref[n + 1], ... (ref: the
row's greedy continuation from a plain run of the same request, whose first n tokens the row has already
emitted, greedy speculation being lossless); draft k (1-based) is kept with probability rates[k - 1] given
drafts 1..k-1 were kept (conditional rates, as synodic/spec/training.py reports them), and the first one not
kept is replaced by another token, so the real verify rejects it there. Verification stays real, so the
outputs remain the plain greedy outputs; only the number of accepted drafts is chosen.

The draws are a fixed table indexed by (request, output length, position), drawn from `seed`: two runs of
the same requests accept the same drafts whatever the batching or step overlap. Greedy requests only.

`force=True` (pipeline.acceptance=forced) also replaces the verify's decision: a row keeps exactly the drafts
its draws keep and emits the reference tokens, whatever the target's argmax said. The target still runs the
whole window (verification's cost is paid) and the acceptance compare still runs; only its result is
overridden. This is for random-weight bf16 presets: their logits are near ties, so the argmax of a T-row
verify GEMM differs from the one-row decode's often enough that a row leaves its reference within a few steps
and drafts from a stale continuation (measured on nemotron_h_8b with rates 0.8: position-1 acceptance 0.15).
Forced rows cannot leave the reference, so their outputs equal it by construction (not a losslessness check).
What forcing overrides is kept as a check instead: `verify_digest()` sums, over every real row of every forced
step, the target's own accepted count and a hash of its own verify tokens (with the row's position): two runs
of the same requests whose targets computed the same argmaxes (e.g. two exact KV policies) give equal digests.

Two paths, the same draws: `propose` (the engine's op-by-op speculative step) replaces drafts on the host;
for a device drafter (`graph_safe`), `draft_device` replaces them on the device from per-slot tables filled
at prefill (tokens and draws by absolute position), so the engine's captured speculative step
(ModelRunner.speculate, one CUDA graph) runs with the wrapper inside it."""
import numpy as np
import torch

from synodic.transfer import pinned

from .runtime import Drafter


class ControlledDrafter(Drafter):
    def __init__(self, inner, gamma: int, rates: list[float], reference: dict[int, list[int]], vocab_size: int,
                 seed: int = 0, max_slots: int = 0, max_len: int = 0, device="cpu", force: bool = False):
        if len(rates) < gamma:
            raise ValueError(f"controlled acceptance: {len(rates)} rates for γ={gamma}; expected at least {gamma}")
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"controlled acceptance: rates {rates}; expected each in [0, 1]")
        self.inner, self.gamma, self.vocab = inner, gamma, vocab_size
        self.rates = np.asarray(rates[:gamma], dtype=np.float64)
        self.seed = seed
        self.hidden_layers = inner.hidden_layers
        ids = sorted(reference)
        self._row = {i: k for k, i in enumerate(ids)}
        n = max((len(reference[i]) for i in ids), default=0)
        # -1 past a row's reference: such drafts cannot be controlled (counted in `beyond_reference`)
        self.ref = np.full((len(ids), n + gamma), -1, dtype=np.int64)
        for i in ids:
            self.ref[self._row[i], :len(reference[i])] = reference[i]
        self.draws = np.random.default_rng(seed).random((len(ids), n + 1, gamma))
        self.beyond_reference = 0
        self.force = force
        self._dev = None
        if self.graph_safe or force:  # per slot (+ the scratch row for padding), by absolute position
            dev, width = torch.device(device), max_len + gamma + 2
            self._dev = {"tgt": torch.full((max_slots + 1, width), -1, dtype=torch.long, device=dev),
                         "u": torch.ones(max_slots + 1, width, gamma, dtype=torch.float32, device=dev),
                         "rates": torch.tensor(self.rates, dtype=torch.float32, device=dev),
                         "k": torch.arange(gamma, device=dev),
                         "unknown": torch.zeros((), dtype=torch.long, device=dev),
                         # forced steps: [target-accepted drafts, hash of the target's own tokens] over real rows
                         "raw": torch.zeros(2, dtype=torch.long, device=dev),
                         "last": torch.zeros(2, dtype=torch.long, device=dev),  # the latest step's share of raw
                         "mix": torch.from_numpy(np.random.default_rng(0x5EED).integers(
                             -(1 << 62), 1 << 62, gamma + 2) | 1).to(dev)}  # odd 64-bit hash mixers

    @property
    def graph_safe(self) -> bool:
        return bool(self.inner.graph_safe)

    @property
    def stages_drafts(self) -> bool:
        return bool(self.inner.stages_drafts)

    @property
    def uses_history(self) -> bool:
        return bool(self.inner.uses_history)

    @property
    def chains(self) -> bool:
        return bool(self.inner.chains) and self._dev is not None  # draft_device reads the device tables

    @property
    def gate(self):
        return self.inner.gate

    @property
    def deferred(self):
        return self.inner.deferred

    def lazy_ring(self, max_slots: int):
        return self.inner.lazy_ring(max_slots)

    def bind_history(self, history) -> None:
        self.inner.bind_history(history)

    def on_prefill(self, reqs, hidden) -> None:
        self.inner.on_prefill(reqs, hidden)
        if self._dev is None:
            return
        tgt, u = self._dev["tgt"], self._dev["u"]
        width = tgt.shape[1]
        for r in reqs:  # (a recompute after preemption refills the same absolute positions)
            row, P = self._row[r.id], len(r.prompt_ids)
            line = torch.full((width,), -1, dtype=torch.long)
            ref = torch.from_numpy(self.ref[row])[:max(0, width - P)]
            line[P:P + len(ref)] = ref  # token at absolute position q: ref[q - P]
            draws = torch.ones(width, self.gamma, dtype=torch.float32)
            d = torch.from_numpy(self.draws[row]).float()[:width - P + 1]
            draws[P - 1:P - 1 + len(d)] = d  # draws for an anchor at position q: output length q + 1 - P
            tgt[r.slot].copy_(line)
            u[r.slot].copy_(draws)

    def draft_device(self, slots, anchors, positions, gamma: int):
        """Device twin of propose (inside the captured step): the real drafter's drafts are computed and replaced
        by the slot's reference tokens, kept while the draws fall under the rates."""
        _, n = self.inner.draft_device(slots, anchors, positions, gamma)  # the real drafter's whole cost
        t = self._dev
        width = t["tgt"].shape[1]
        pos = positions.long().clamp(0, width - 1)
        target = t["tgt"][slots[:, None], (pos[:, None] + 1 + t["k"][:gamma]).clamp(max=width - 1)]
        keep = torch.cumprod((t["u"][slots, pos, :gamma] < t["rates"][:gamma]).long(), 1).bool()
        unknown = target < 0
        # padding rows (the scratch slot, last table row) have no reference: not counted as uncontrolled
        t["unknown"] += (unknown & (slots[:, None] < t["tgt"].shape[0] - 1)).sum()
        target = torch.where(unknown, 0, target)
        return torch.where(keep, target, (target + 1) % self.vocab), n

    def commit_device(self, slots, hidden, start, accepted) -> None:
        self.inner.commit_device(slots, hidden, start, accepted)

    def decide(self, slots, positions, m, tokens, n_drafts=None):
        """force=True: the verify's (accepted [B], tokens [B, G+1]) replaced, on the device, by the draws' kept
        count (at most n_drafts) and the reference tokens after each row's anchor at positions[i]; otherwise
        returned as they are. Graph-safe: fixed tables, no host read."""
        if not self.force:
            return m, tokens
        t = self._dev
        G = tokens.shape[1] - 1
        self._digest(slots, positions, m, tokens)
        width = t["tgt"].shape[1]
        pos = positions.long().clamp(0, width - 1)
        kept = torch.cumprod((t["u"][slots, pos, :G] < t["rates"][:G]).long(), 1).sum(1)
        if n_drafts is not None:
            kept = torch.minimum(kept, n_drafts.long())
        ref = t["tgt"][slots[:, None], (pos[:, None] + 1 + torch.arange(G + 1, device=pos.device)).clamp(max=width - 1)]
        return kept.to(m.dtype), torch.where(ref < 0, tokens, ref)

    def _digest(self, slots, positions, m, tokens) -> None:
        """Accumulate the target's own decision of this step (before forcing) over real rows: device ops only."""
        t = self._dev
        real = (slots < t["tgt"].shape[0] - 1).long()
        G1 = tokens.shape[1]
        row = ((tokens.long() + 1) * t["mix"][:G1]).sum(1) + (m.long() + 1) * t["mix"][G1]
        row = row * (2 * positions.long() + 1)  # int64 arithmetic wraps: a hash, summed order-free over rows
        t["last"].copy_(torch.stack([(m.long() * real).sum(), (row * real).sum()]))
        t["raw"] += t["last"]

    def discard_step(self) -> None:
        """The latest step kept nothing (queued behind the step its rows ended in): out of the digest, so runs
        that stop at the same step give the same digest whether or not a step was queued past it."""
        if self.force:
            self._dev["raw"] -= self._dev["last"]

    def verify_digest(self) -> dict[str, int] | None:
        """Forced runs: the target's own accepted drafts and the hash of its verify tokens, summed over real rows
        and steps (see the module docstring); None when not forced."""
        if not self.force:
            return None
        acc, h = self._dev["raw"].tolist()
        return {"target_accepted": acc, "hash": h}

    def propose(self, batch, gamma, temperature, generator):
        drafts, _, _ = self.inner.propose(batch, gamma, temperature, generator)  # the real drafter's whole cost
        if any(r.params.temperature > 0 for r in batch):
            raise ValueError("controlled acceptance needs greedy requests (temperature 0): a sampled verify "
                             "accepts by probability, not by the chosen rates")
        # the engine's device: a host-list drafter (ngram) gives no tensor to take it from
        dev = drafts.device if isinstance(drafts, torch.Tensor) else temperature.device
        rows = np.fromiter((self._row[r.id] for r in batch), dtype=np.int64, count=len(batch))
        n = np.fromiter((len(r.output_ids) for r in batch), dtype=np.int64, count=len(batch))
        n_draw = np.minimum(n, self.draws.shape[1] - 1)
        target = self.ref[rows[:, None], np.minimum(n[:, None] + np.arange(gamma), self.ref.shape[1] - 1)]
        keep = np.cumprod(self.draws[rows, n_draw, :gamma] < self.rates[:gamma], axis=1).astype(bool)
        unknown = target < 0
        self.beyond_reference += int(unknown.sum())
        target = np.where(unknown, 0, target)
        out = np.where(keep, target, (target + 1) % self.vocab)  # the first draft not kept is rejected there
        host = torch.from_numpy(out)
        return pinned(host, dev).to(dev, non_blocking=True), None, None

    def on_commit(self, batch, hidden, start, accepted) -> None:
        self.inner.on_commit(batch, hidden, start, accepted)

    def step_bytes(self, batch, lengths) -> dict[str, int]:
        return self.inner.step_bytes(batch, lengths)

    def summary(self) -> dict:
        return {**self.inner.summary(), "controlled_acceptance": {
            "rates": self.rates.tolist(), "seed": self.seed, "forced": self.force,
            "beyond_reference": self.unknown_drafts()}}

    def unknown_drafts(self) -> int:
        """Drafts past a row's reference (not controlled): should be 0."""
        return self.beyond_reference + (int(self._dev["unknown"]) if self._dev is not None else 0)


def reference_continuations(graph, requests, extra: int, on_engine=None) -> dict[int, list[int]]:
    """Controlled acceptance's reference: the target's greedy continuation of `requests` (a plain engine run over
    the same graph, speculation off), `extra` tokens past each request's max_tokens (a speculative row proposes
    up to γ tokens past what it emits). on_engine(engine): called before the run (e.g. to seed contexts)."""
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams

    refs = [Request(r.id, list(r.prompt_ids), SamplingParams(max_tokens=r.params.max_tokens + extra))
            for r in requests]
    spec, graph.spec = graph.spec, None
    try:
        eng = Engine(graph)
        if on_engine is not None:
            on_engine(eng)
        eng.generate(refs)
    finally:
        graph.spec = spec
    return {r.id: r.output_ids for r in refs}


def conditional_rates(stats) -> list[float | None]:
    """Per-position conditional acceptance (accepted at k given 1..k-1 accepted) from a SpecStats, whose
    counters are unconditional (rows whose draft k was accepted, over rows with a draft k)."""
    out = []
    for k, (a, d) in enumerate(zip(stats.pos_accepted, stats.pos_drafted)):
        reach = d if k == 0 else stats.pos_accepted[k - 1]
        out.append(a / reach if reach else None)
    return out
