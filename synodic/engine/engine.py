"""The decode loop: admit → prefill → grow/preempt → one batched decode step → sample → finish."""
import time
from collections.abc import Callable

import torch

from .ledger import ByteLedger
from .request import Request
from .runner import ModelRunner
from .sampler import Sampler
from .scheduler import Scheduler


class Engine:
    def __init__(self, graph, max_running: int | None = None):
        self.graph = graph
        self.runner = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device,
                                  graph.cuda_graphs)
        blocks = graph.kv.blocks if graph.kv is not None else None
        self.scheduler = Scheduler(graph.max_slots, blocks, max_running or graph.max_slots)
        self.sampler = Sampler()
        self.ledger = ByteLedger()
        self.decode_s = 0.0
        self.prefill_s = 0.0

    def _append(self, r: Request, tok: int, now: float, on_token) -> None:
        r.output_ids.append(tok)
        if r.first_token_s is None:
            r.first_token_s = now
        if on_token is not None:
            on_token(r, tok)
        if tok in r.params.stop_token_ids:
            self.scheduler.finish(r, "stop")
        elif len(r.output_ids) >= r.params.max_tokens:
            self.scheduler.finish(r, "length")
        if r.done:
            r.finish_s = now
            self.sampler.forget(r.id)

    def generate(self, requests: list[Request], on_token: Callable[[Request, int], None] | None = None,
                 progress: Callable[[int], None] | None = None,
                 drafter: Callable[[list[Request]], list[list[int]]] | None = None) -> list[Request]:
        """Serves every request to completion; on_token streams (request, token) as tokens appear.
        With a drafter (requests → γ draft tokens each), every step verifies [last token, drafts] and
        keeps the greedy-accepted prefix plus one target token (greedy requests only)."""
        if drafter is not None and any(r.params.temperature > 0 for r in requests):
            raise ValueError("drafter: the verify path accepts drafts greedily; expected temperature=0 "
                             "requests (lossless sampling verification comes with the draft-model schemes)")
        t0 = time.perf_counter()
        for r in requests:
            r.arrival_s = t0
            self.scheduler.add(r)
        sched = self.scheduler
        self.accepted: list[int] = []
        while sched.has_work():
            admitted = sched.admit()
            for r in admitted:
                ts = time.perf_counter()
                logits = self.runner.prefill(r.slot, r.context)
                tok = self.sampler.sample(logits[None], [r])[0]
                now = time.perf_counter()
                self.prefill_s += now - ts
                self._append(r, tok, now, on_token)
            sched.grow()
            batch = [r for r in sched.running if not r.done]
            if not batch:
                if not admitted and not sched.running:  # pool empty yet nothing admits: give up loudly
                    for r in list(sched.waiting):
                        sched.waiting.remove(r)
                        sched.finish(r, "rejected_kv_capacity", release=False)
                continue
            if drafter is not None and self._spec_step(batch, drafter, on_token, progress):
                continue
            ts = time.perf_counter()
            logits = self.runner.decode([r.slot for r in batch], [r.length - 1 for r in batch],
                                        [r.output_ids[-1] for r in batch], max(r.length for r in batch))
            toks = self.sampler.sample(logits, batch)
            now = time.perf_counter()
            self.decode_s += now - ts
            self.ledger.add(len(batch), self.graph.step_bytes([r.slot for r in batch], [r.length for r in batch]))
            for r, tok in zip(batch, toks):
                self._append(r, tok, now, on_token)
            if progress is not None:
                progress(len(batch))
        return requests

    def _spec_step(self, batch, drafter, on_token, progress) -> None:
        """Verify [anchor, d_1..d_γ] per row; accept drafts while they equal the target's argmax, then
        append the target's token at the first mismatch (or the bonus token). Outputs equal plain
        greedy decoding; state and KV roll back by cursor / length. Returns False (nothing done) when
        the pages cannot hold the window this step, so the caller takes a plain step instead."""
        drafts = drafter(batch)
        T = 1 + len(drafts[0])
        if self.scheduler.blocks is not None:  # pages for the whole window before it runs
            short = [r for r in batch if not self.scheduler.blocks.can_grow(r.slot, r.length + T - 1)]
            if short:  # fall back to a plain step; the scheduler preempts as usual next time
                return False
            for r in batch:
                self.scheduler.blocks.grow(r.slot, r.length + T - 1)
        ts = time.perf_counter()
        windows = [[r.output_ids[-1], *d] for r, d in zip(batch, drafts)]
        logits = self.runner.verify([r.slot for r in batch], [r.length - 1 for r in batch], windows,
                                    max(r.length for r in batch) + T - 1)
        target = logits.argmax(-1)  # [B, T]
        win = torch.tensor(windows, device=target.device)
        match = (win[:, 1:] == target[:, :-1]).int().cumprod(-1).sum(-1)  # accepted drafts per row
        self.runner.commit(match + 1)  # anchor + accepted drafts enter the state, on the device
        target, match = target.tolist(), match.tolist()  # the step's one host sync
        now = time.perf_counter()
        self.decode_s += now - ts
        lengths = [r.length for r in batch]
        self.ledger.add(len(batch), self.graph.step_bytes([r.slot for r in batch], lengths, T,
                                                          [m + 1 for m in match]))
        for r, m, tgt in zip(batch, match, target):
            self.accepted.append(m + 1)
            for tok in tgt[: m + 1]:
                if r.done:
                    break
                self._append(r, tok, now, on_token)
        if progress is not None:
            progress(len(batch))
        return True
