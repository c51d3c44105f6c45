"""Cheap long contexts for decode benchmarks: prefill each distinct prompt once for real, then seed every other
request with that prompt by replaying the recorded prefill into its own slot, through the KV policy's own store.

A top-k KV policy receives a prompt's state in exactly one call per attention layer,
`write_prefill(i, slot, 0, k, v, sel_last, index_k)` (the layer's K/V rows after RoPE, the last query's top-k,
the learned indexer's keys; synodic/kv/topk.py), and the engine then samples the first token from the prefill's
last logits and hands the drafter the prefill's hidden states (`Drafter.on_prefill`). `ContextFill` wraps the
engine's `ModelRunner.prefill_batch`: the first prefill of a prompt runs the model and records those arguments
(cloned), its hidden states (the drafter's target layers, recorded even when the running graph has no drafter)
and its last logits; every later prefill of the same prompt, in any policy built on the same model, replays the
`write_prefill` calls into the new slot and returns the recorded logits and hidden states. Why this is what a
real prefill of that request would leave:

- the calls carry the model's outputs only: the sparse prefill's selection and attention are the same code on
  the same values for every top-k policy (docs/kv_residency.md), so what layer i receives does not depend on
  the policy or the slot; the policy itself does all placement (host pool rows, resident pages, index keys,
  hot-buffer preload, the last selection) for the new slot, in its own pages;
- the scheduler admits and grows the request as usual (admission, adaptive's demotions) before its prefill,
  and the engine samples its first token and seeds the drafter from the same tensors a real prefill returns;
- nothing is shared between requests afterwards: each owns its pages, host rows and index pages, so its decode
  steps read, resolve and fetch its own rows (no aliasing that would make host fetches shared).

The timed decode therefore runs the engine's real steps over real per-request state; only the prompts repeat
(requests with the same prompt hold equal contents in different pages). Attention-only models: a model with
SSM layers keeps per-slot recurrent state that `write_prefill` does not carry, so it is refused.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class PrefillRecord:
    """One prompt's prefill, as the KV policy and the engine received it."""
    length: int
    layers: dict[int, tuple] = field(default_factory=dict)  # layer -> (k, v, sel_last, index_k)
    logits: torch.Tensor | None = None                       # [1, V] last logits
    hidden: torch.Tensor | None = None                       # [1, T, n*H] the drafter's target layers, or None

    def nbytes(self) -> int:
        ts = [t for lay in self.layers.values() for t in lay if t is not None] + [self.logits, self.hidden]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


class ContextFill:
    """Records each distinct prompt's prefill once and replays it into later requests' slots (module docstring).
    hidden_layers: the target blocks a drafter reads (recorded with every prompt, so a record made on a graph
    without speculation seeds a drafter too)."""

    def __init__(self, hidden_layers: tuple[int, ...] = ()):
        self.hidden_layers = tuple(hidden_layers)
        self.records: dict[tuple[int, ...], PrefillRecord] = {}
        self.stats = {"real": 0, "real_s": 0.0, "real_tokens": 0, "replayed": 0, "replay_s": 0.0}

    def install(self, engine) -> None:
        """Route `engine`'s prefills through the fill (before engine.generate)."""
        runner = engine.runner
        if getattr(runner.model, "ssm_layers", None):
            raise ValueError("ContextFill: the model has SSM layers, whose per-slot state a replayed prefill would "
                             "not carry; expected an attention-only model")
        if runner.kv is None or getattr(runner.kv, "prefill_attend", None) is None:
            raise ValueError("ContextFill: expected a top-k KV policy (one sparse prefill per request)")
        real = runner.prefill_batch

        def prefill_batch(slots, contexts):
            return torch.cat([self._one(runner, real, s, c) for s, c in zip(slots, contexts)])
        runner.prefill_batch = prefill_batch

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self.records.values())

    @staticmethod
    def _sync(device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _one(self, runner, real, slot: int, context: list[int]) -> torch.Tensor:
        key = tuple(context)
        rec = self.records.get(key)
        t0 = time.perf_counter()
        if rec is None:
            logits = self._record(runner, real, slot, context)
            self._sync(runner.device)
            self.stats["real"] += 1
            self.stats["real_tokens"] += len(context)
            self.stats["real_s"] += time.perf_counter() - t0
            return logits
        out = self.replay(runner, slot, rec)
        self._sync(runner.device)
        self.stats["replayed"] += 1
        self.stats["replay_s"] += time.perf_counter() - t0
        return out

    def _record(self, runner, real, slot: int, context: list[int]) -> torch.Tensor:
        kv = runner.kv
        rec = PrefillRecord(len(context))
        store = kv.write_prefill

        def recording(i, slot_, start, k, v, sel_last=None, index_k=None):
            rec.layers[i] = tuple(None if t is None else t.clone() for t in (k, v, sel_last, index_k))
            return store(i, slot_, start, k, v, sel_last, index_k=index_k)
        own = runner.hidden_layers
        runner.hidden_layers = self.hidden_layers or own
        kv.write_prefill = recording  # prefill_attend calls self.write_prefill: the instance attribute wins
        try:
            logits = real([slot], [context])
        finally:
            del kv.write_prefill
            runner.hidden_layers = own
        if len(rec.layers) != kv.NL:
            raise RuntimeError(f"ContextFill: recorded {len(rec.layers)} of {kv.NL} attention layers' prefill")
        rec.logits = logits.clone()
        if self.hidden_layers or own:
            rec.hidden = runner.hidden.clone()
        if not own:
            runner.hidden = None
        self.records[tuple(context)] = rec
        return logits

    @torch.inference_mode()
    def replay(self, runner, slot: int, rec: PrefillRecord) -> torch.Tensor:
        """Seed `slot` (pages already granted by the scheduler) with a recorded prefill; returns its logits [1, V]
        and leaves its hidden states where the engine hands them to the drafter."""
        kv = runner.kv
        for i in sorted(rec.layers):
            k, v, sel_last, index_k = rec.layers[i]
            kv.write_prefill(i, slot, 0, k, v, sel_last, index_k=index_k)
        if runner.hidden_layers:
            if rec.hidden is None:
                raise RuntimeError("ContextFill: a record without hidden states for a graph whose drafter needs "
                                   "them (construct ContextFill with the drafter's hidden_layers)")
            if tuple(runner.hidden_layers) != (self.hidden_layers or tuple(runner.hidden_layers)):
                raise RuntimeError(f"ContextFill: recorded hidden layers {self.hidden_layers}, the drafter reads "
                                   f"{tuple(runner.hidden_layers)}")
            runner.hidden = rec.hidden
        return rec.logits
