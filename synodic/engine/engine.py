"""The decode loop: admit → prefill → grow/preempt → one batched decode step → sample → finish.

Overlapped steps (`graph.overlap`): while no admission is due (greedy rows, pages for one more token), step
N + 1 is queued with step N's sampled tokens still on the device (gathered for the rows that continue: rows
at their length limit leave), and step N's tokens are read back and processed while N + 1 runs, so the
host's per-step work (read-back, bookkeeping, the next step's inputs and launch) leaves the GPU's critical
path. A row that stops at step N has also run step N + 1; that token is dropped (its slot is freed after N,
and nothing reuses the slot before N + 1 has been read back: admissions wait for the chain to end)."""
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from synodic.spec.runtime import SyntheticDrafter
from synodic.spec.stats import SpecStats
from synodic.spec.verify import verify
from synodic.transfer import PendingTokens, pinned

from .ledger import ByteLedger
from .request import Request
from .runner import ModelRunner
from .sampler import Sampler
from .scheduler import Scheduler


@dataclass
class _Step:
    batch: list[Request]
    logits: torch.Tensor               # valid until the next step runs (a graph's output buffer)
    tokens: torch.Tensor | None        # greedy tokens on the device (all rows greedy), else None
    pending: PendingTokens | None
    queued_s: float = 0.0              # when it was queued (a speculative engine's plain steps count verify time)
    fed: bool = False                  # it fed a drafter's context (a gate times those steps apart)


def _greedy(rows: list) -> bool:
    """Whether every row is greedy: requests by their temperature; indices of a chained step's rows always are (only
    greedy steps chain)."""
    return all(isinstance(r, int) or r.params.temperature == 0 for r in rows)


class Engine:
    replicas = None  # per-replica summaries when the run was served by several engines (runtime=ray)

    def __init__(self, graph, max_running: int | None = None):
        self.graph = graph
        self.runner = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device,
                                  graph.cuda_graphs)
        blocks = graph.kv.blocks if graph.kv is not None else None
        self.scheduler = Scheduler(graph.max_slots, blocks, max_running or graph.max_slots)
        self.sampler = Sampler()
        self.overlap = graph.overlap
        self.overlapped_steps = 0  # steps queued before the previous step's tokens were read back
        self.synced_steps = 0      # steps queued from tokens on the host (a chain's first step)
        self.ledger = ByteLedger()
        self.decode_s = 0.0
        self.prefill_s = 0.0
        self.prefill_tokens = graph.cfg.runtime.prefill_tokens
        self.prefill_forwards = 0  # model forwards spent on prefill (several prompts share one)
        self._use_drafter(graph.spec, getattr(graph.cfg.spec, "num_speculative_tokens", 0))
        self.spec_max_batch = getattr(graph.cfg.spec, "max_batch", None)
        self.spec_stats = SpecStats()
        self._cap_seen, self._last_read = 0.0, None  # the drafter's gate's step timing (captures excluded)
        self.lazy_ring = True  # a closed gate's plain steps defer the drafter's ring feed (spec.runtime.LazyRing)

    def _use_drafter(self, drafter, gamma: int) -> None:
        self.drafter, self.gamma = drafter, gamma
        self.runner.hidden_layers = drafter.hidden_layers if drafter is not None else ()
        self._draft_gen = None
        if drafter is not None:  # the neural drafters' sampled drafts (the batch's one device generator)
            self._draft_gen = torch.Generator(device=self.runner.device).manual_seed(
                getattr(self.graph.cfg.spec, "seed", 0))
        if drafter is not None and drafter.uses_history:  # room for a window queued behind one in flight
            drafter.bind_history(self.runner.track_history(self.graph.max_seq_len + 2 * (gamma + 1)))

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

    def stop(self, reason: str = "stopped") -> None:
        """End every unfinished request now (waiting ones too) with `reason`; generate() drains the step in
        flight and returns. For callers that serve a fixed number of steps (pipeline=bench calls it from the
        progress callback); nothing is admitted after it, so the freed slots stay unused until generate returns."""
        now = time.perf_counter()
        for r in [*self.scheduler.waiting, *self.scheduler.running]:
            self.scheduler.finish(r, reason)
            r.finish_s = now
            self.sampler.forget(r.id)
        self.scheduler.waiting.clear()

    def generate(self, requests: list[Request], on_token: Callable[[Request, int], None] | None = None,
                 progress: Callable[[int], None] | None = None,
                 drafter: Callable[[list[Request]], list[list[int]]] | None = None) -> list[Request]:
        """Serves every request to completion; on_token streams (request, token) as tokens appear.
        With the graph's spec drafter (or `drafter`, a test's callable: requests → γ draft tokens each),
        every step verifies [last token, drafts] and keeps the losslessly accepted prefix plus one target
        token (synodic.spec.verify)."""
        if drafter is not None:
            self._use_drafter(SyntheticDrafter(drafter), 0)
        t0 = time.perf_counter()
        for r in requests:
            r.arrival_s = t0
            self.scheduler.add(r)
        sched = self.scheduler
        self.accepted: list[int] = []
        while sched.has_work():
            was_running = bool(sched.running)
            admitted = sched.admit()
            for group in self._prefill_groups(admitted):
                ts = time.perf_counter()
                logits = self.runner.prefill_batch([r.slot for r in group], [r.context for r in group])
                toks = self.sampler.sample(logits, group)
                if self.drafter is not None:
                    self.drafter.on_prefill(group, self.runner.hidden if self.runner.hidden_layers else None)
                now = time.perf_counter()
                self.prefill_s += now - ts
                self.prefill_forwards += 1
                for r, tok in zip(group, toks):
                    self._append(r, tok, now, on_token)
            sched.grow()
            batch = [r for r in sched.running if not r.done]
            if not batch:
                # Only when the pool was already empty before admit() does a refusal mean the head can
                # never fit; pages freed by grow() this step are offered to the waiting requests next step.
                if not admitted and not sched.running and not was_running and sched.waiting:
                    sched.finish(sched.waiting.popleft(), "rejected_kv_capacity", release=False)
                continue
            if self.drafter is not None and self._speculates(batch):
                self._spec_step(batch, on_token, progress)
                continue
            # plain decode steps, overlapped; a speculative engine's (past spec.max_batch, or the last before a
            # probe while the drafter's gate finds that drafts cannot pay) also feed the drafter's context
            ts, cap = time.perf_counter(), self.runner.capture_s
            self._cap_seen, self._last_read = cap, None
            step = self._launch(batch, [r.output_ids[-1] for r in batch], 0, self._plain_ring(batch))
            self.synced_steps += 1
            while step is not None:
                nxt = None
                keep = self._chain_rows(step)
                if keep is not None and self.drafter is not None and self._speculates(keep):
                    keep = None  # speculation resumes after this step (the batch shrank to spec.max_batch, or the
                    # gate drafts again)
                if keep is not None:
                    rows = [step.batch[i] for i in keep]
                    nxt = self._launch(rows, self._gather(step.tokens, keep), 1, self._plain_ring(rows))
                    self.overlapped_steps += 1
                self._finish(step, on_token, progress)
                step = nxt
            self.decode_s += time.perf_counter() - ts - (self.runner.capture_s - cap)  # captures are warm-up
        return requests

    def _prefill_groups(self, admitted: list[Request]) -> list[list[Request]]:
        """Admitted requests in prefill forwards: equal context lengths together, up to runtime.prefill_tokens
        prompt tokens a forward (one request a forward where the KV policy prefills sparsely)."""
        if not self.runner.batched_prefill:
            return [[r] for r in admitted]
        by_len: dict[int, list[Request]] = {}
        for r in admitted:
            by_len.setdefault(r.length, []).append(r)
        groups = []
        for n, rs in by_len.items():
            per = max(1, self.prefill_tokens // n)
            groups += [rs[i:i + per] for i in range(0, len(rs), per)]
        return groups

    def _speculates(self, rows: list) -> bool:
        """Whether a speculative engine drafts for these rows (requests, or indices of a step's rows) this step:
        not past spec.max_batch and, under the drafter's gate (synodic/spec/gate.py), where drafting beats plain
        steps or a probe is due. Only all-greedy batches are gated: a sampled
        row's draws are per speculative step, so its tokens must not depend on the gate's choices."""
        if self._past_max_batch(rows):
            return False
        gate = self.drafter.gate
        if gate is None or not _greedy(rows):
            return True
        return gate.drafts(len(rows))

    def _plain_ring(self, batch):
        """What a speculative engine's plain step feeds: the drafter's context ring (past spec.max_batch), or,
        while the drafter's gate is closed, its LazyRing (flushed by the next drafting step) in the last
        `gate.feed` steps before a probe and nothing before them; None without a drafter that reads target
        features."""
        if self.drafter is None or not self.runner.hidden_layers:
            return None
        gate = self.drafter.gate
        if gate is None or self._past_max_batch(batch):
            return self.drafter
        if not gate.feeds():
            return None
        if not self.lazy_ring:
            return self.drafter
        lazy = self.drafter.lazy_ring(self.graph.max_slots)
        lazy.pending = True
        return lazy

    def _flush_ring(self, batch) -> bool:
        """Before a drafting step: the positions a closed gate's plain steps buffered go into the context ring
        (True when there were any)."""
        lazy = self.drafter.deferred
        if lazy is None or not lazy.pending:
            return False
        dev = self.runner.device
        lazy.flush(pinned(torch.tensor([r.slot for r in batch], dtype=torch.long), dev).to(dev, non_blocking=True))
        lazy.pending = False
        return True

    def _past_max_batch(self, rows: list) -> bool:
        """Whether a greedy speculative engine steps these rows (requests, or indices of a step's rows) plainly:
        more than spec.max_batch of them, where a verify window costs more than its drafts earn. Sampled batches
        past it take _spec_step's one-token verify."""
        if self.spec_max_batch is None or len(rows) <= self.spec_max_batch:
            return False
        return _greedy(rows)

    def _launch(self, batch: list[Request], tokens, ahead: int, ring=None) -> _Step:
        """Queue one decode step; ahead = 1 when it follows a step whose tokens are not appended yet (the loop
        keeps at most one such step in flight). ring: the drafter whose context ring the step feeds."""
        logits = self.runner.decode([r.slot for r in batch], [r.length - 1 + ahead for r in batch], tokens,
                                    max(r.length for r in batch) + ahead, ring=ring)
        if any(r.params.temperature > 0 for r in batch):
            return _Step(batch, logits, None, None, time.perf_counter(), ring is not None)
        toks = logits.argmax(-1)
        return _Step(batch, logits, toks, PendingTokens(toks), time.perf_counter(), ring is not None)

    def _chain_rows(self, step: _Step) -> list[int] | None:
        """Rows of `step` (indices) whose next step may be queued before `step`'s tokens are known: not finished,
        not at their length limit with `step`'s token; None when no step can be queued (an admission is due, no
        row continues, or pages run short). Pages for the next step are taken here."""
        sched = self.scheduler
        if not self.overlap or step.tokens is None:
            return None
        if sched.waiting and sched.free_slots and len(sched.running) < sched.max_running:
            return None  # an admission is due: prefill needs the host
        keep = [i for i, r in enumerate(step.batch) if not r.done and len(r.output_ids) + 2 <= r.params.max_tokens]
        if not keep:
            return None
        # a KV policy that decides residency from the free pages (kv=adaptive: demotion, promotion) grows only
        # into free pages here, and only when no row leaves: a synced step would release the leaving rows' pages
        # first, so its choices, and hence fetches, would differ
        evicts = sched.blocks is not None and sched.blocks.evicts
        if evicts and len(keep) < sum(not r.done for r in step.batch):
            return None
        # the next step writes position r.length
        return keep if sched.reserve([step.batch[i] for i in keep], 1, free_only=True) else None

    def _gather(self, tokens: torch.Tensor, keep: list[int]) -> torch.Tensor:
        """tokens[keep] on the device, the index copied without waiting for the stream."""
        if len(keep) == tokens.shape[0]:
            return tokens
        idx = pinned(torch.tensor(keep, dtype=torch.long), tokens.device).to(tokens.device, non_blocking=True)
        return tokens.index_select(0, idx)

    def _finish(self, step: _Step, on_token, progress) -> None:
        """Read a step's tokens back, account its bytes (every row it ran) and append them."""
        batch = step.batch
        toks = step.pending.wait() if step.pending is not None else self.sampler.sample(step.logits, batch)
        now = time.perf_counter()
        live = sum(not r.done for r in batch)  # tokens kept; the bytes are every row's
        slots = [r.slot for r in batch]
        self.ledger.add(live, self.graph.step_bytes(slots, [r.length for r in batch]))
        self.graph.advance(slots)
        for r, tok in zip(batch, toks):
            if not r.done:  # a row that stopped at the previous step also ran this one
                self._append(r, tok, now, on_token)
        if self.drafter is not None:  # a plain step of a speculative engine: one kept token per row, no drafts
            self.accepted += [1] * live
            if self.drafter.gate is not None:  # its period: since the previous step's read-back (or its launch)
                t = step.queued_s if self._last_read is None else self._last_read
                self.drafter.gate.plain_step(len(batch), None if self.runner.capture_s != self._cap_seen else now - t,
                                             fed=step.fed)
                self._last_read = now
            self.spec_stats.add([0] * live, [0] * live, live, 0.0, now - step.queued_s, plain=True)
        self._cap_seen = self.runner.capture_s
        if progress is not None:
            progress(live)

    def _spec_step(self, batch, on_token, progress) -> None:
        """One speculative step: the drafter proposes γ tokens per row, one target forward verifies
        [anchor, d_1..d_γ], synodic.spec.verify keeps the lossless prefix plus one target token, the state and
        KV commit by cursor / length, and the drafter's context takes the committed tokens' hidden states — all
        on the device; the accepted counts and tokens come back in the step's one host sync. Rows get pages
        for the whole window first; when some row cannot grow that far, the step verifies no drafts (a plain
        step) and the scheduler preempts as usual next time. Greedy batches run as ModelRunner.speculate (one CUDA
        graph per bucket with graphs on) when the drafter drafts on the device (`graph_safe`) or its host drafts
        may fill the fixed window (`stages_drafts`); the rest step by step (_spec_eager). A greedy step in which
        no row has a draft (host drafts only: no n-gram match anywhere) runs the plain decode step instead of a
        window of padding (_plain_step; counted as SpecStats.plain_steps).
        Overlapped (`graph.overlap`, a drafter that `chains`): while every row goes on and no admission is due,
        the next greedy step is queued before this one is read back (ModelRunner.speculate_next: anchors and
        positions from this step's result on the device), so its read-back and bookkeeping run beside it."""
        b = len(batch)
        t0, cap = time.perf_counter(), self.runner.capture_s
        if self._flush_ring(batch) and self.runner.device.type == "cuda":
            # the buffered positions' drafter work is the closed gate's cost, not this step's: the gate prices a
            # drafting step without it, so it runs to completion before the step's clock starts
            torch.cuda.synchronize(self.runner.device)
        ts, self._cap_seen = time.perf_counter(), cap
        t_gate = ts
        greedy = all(r.params.temperature == 0 for r in batch)
        if self.spec_max_batch is not None and b > self.spec_max_batch:
            # past spec.max_batch a verify window costs more than its accepted drafts earn: no drafts this step
            out = self._plain_step(batch, ts) if greedy else self._spec_eager(batch, draft=False)
        else:
            out = self._spec_fixed(batch) if greedy and self.gamma else None
            if out is None:
                out = self._spec_eager(batch)
        while out is not None:
            G, n_drafts, rows, td = out
            nxt = None
            if isinstance(rows, PendingTokens):  # a fixed-window step still in flight
                if self._spec_chains(batch):
                    tq = time.perf_counter()  # its drafts are drafted inside it: no draft time of its own
                    nxt = (G, None, PendingTokens(self.runner.speculate_next(
                        self.drafter, b, G, max(r.length for r in batch) + 2 * G + 1)), tq)
                    self.overlapped_steps += 1
                rows = rows.wait()  # the step's one host sync
                n_drafts = [row[-1] for row in rows]
            end = self._spec_account(batch, G, n_drafts, rows, ts, td, on_token, progress, t_gate)
            out = nxt
            ts = td if nxt is None else nxt[3]
            t_gate = end  # a chained step's period: from the previous one's end (it was queued before it)
        self.decode_s += time.perf_counter() - t0 - (self.runner.capture_s - cap)  # captures are warm-up

    def _spec_chains(self, batch) -> bool:
        """Whether the next greedy fixed-window step over `batch` may be queued before the one in flight is read
        back (then its pages are taken here): overlap on, a drafter that drafts from device state alone, no
        admission due, and every row still going after the step in flight whatever it accepts (a row may end on a
        stop token in it: the queued step's tokens for that row are dropped, and the chain ends)."""
        sched, G = self.scheduler, self.gamma
        if not (self.overlap and self.drafter.chains):
            return False
        if self.drafter.gate is not None and not self.drafter.gate.drafts(len(batch)):
            return False  # the gate sends the batch to plain steps
        if sched.waiting and sched.free_slots and len(sched.running) < sched.max_running:
            return False  # an admission is due: prefill needs the host
        if any(r.done or r.params.max_tokens - len(r.output_ids) <= G + 1 for r in batch):
            return False
        # the queued window starts at most G + 1 tokens past today's length
        return sched.reserve(batch, 2 * G + 1, free_only=True)

    def _spec_account(self, batch, G, n_drafts, out, ts: float, td: float, on_token, progress,
                      t_gate: float) -> float:
        """A speculative step's rows [accepted, tokens...] read back: tokens appended, bytes and stats accounted,
        the gate told (the step timed from t_gate). Rows that ended before this step (it was queued behind the step
        they ended in) ran it but keep nothing. Returns when its bookkeeping ended."""
        now = time.perf_counter()
        live = [i for i, r in enumerate(batch) if not r.done]
        if not live:
            self.drafter.discard_step()
        plain = G is None  # no row drafted: the plain decode step ran (_plain_step)
        lengths = [r.length for r in batch]
        slots, kept = [r.slot for r in batch], [row[0] + 1 for row in out]
        if plain:
            entry = self.graph.step_bytes(slots, lengths)
            self.graph.advance(slots)
        else:
            entry = self.graph.step_bytes(slots, lengths, G + 1, kept)
            if G:
                entry.update(self.drafter.step_bytes(batch, lengths))
            self.graph.advance(slots, G + 1, kept)
        emitted = 0
        for i in live:
            r, row = batch[i], out[i]
            self.accepted.append(row[0] + 1)
            for tok in row[1: row[0] + 2]:
                if r.done:
                    break
                self._append(r, tok, now, on_token)
                emitted += 1
        self.ledger.add(emitted, entry)  # tokens this step produced: the rate's numerator, per-token bytes' divisor
        self.spec_stats.add([n_drafts[i] for i in live], [out[i][0] for i in live], emitted, td - ts, now - td,
                            plain=plain)
        gate, end = self.drafter.gate, time.perf_counter()
        if gate is not None and live and _greedy(batch):
            # timed from before its drafts (or the previous chained step's end) to the end of its bookkeeping,
            # unless it captured a graph: a synced step's host work after the read-back runs alone, where a plain
            # step's runs beside the next step
            gate.observe(len(batch), sum(out[i][0] + 1 for i in live) / len(live),
                         1.0 if plain else sum(n_drafts[i] + 1 for i in live) / len(live),
                         None if self.runner.capture_s != self._cap_seen else end - t_gate)
        self._cap_seen = self.runner.capture_s
        if progress is not None:
            progress(len(live))
        return end

    def _spec_fixed(self, batch):
        """A greedy step over the fixed window 1 + γ (ModelRunner.speculate: one CUDA graph per bucket with graphs
        on). A device drafter drafts inside it; any other drafter's drafts are staged into it (fewer real
        drafts than γ are padding); a drafter that picks per-row lengths (load-aware DSpark) gets the window of its
        longest one, so the step verifies what the op-by-op step would, as one graph per (bucket, length). None
        when some row cannot get pages for the whole window."""
        b, G = len(batch), self.gamma
        ts = time.perf_counter()
        drafts = n_drafts = None
        device = self.drafter.graph_safe
        if not device and not self.drafter.stages_drafts:
            return None
        if not device and self.drafter.picks_lengths:  # load-aware DSpark: captured drafts, lengths on the host
            drafts, conf = self.runner.draft(self.drafter, [r.slot for r in batch], [r.length - 1 for r in batch],
                                             [r.output_ids[-1] for r in batch], G, max(r.length for r in batch) + G)
            n_drafts = self.drafter.lengths(conf)
            G = max(n_drafts)  # the window of its longest chosen length
            drafts = drafts[:, :G]
        elif not device:
            drafts, _, n_drafts = self.drafter.propose(batch, G, torch.zeros(b, device=self.runner.device),
                                                       self._draft_gen)
            width = drafts.shape[1] if isinstance(drafts, torch.Tensor) else max(map(len, drafts), default=0)
            if width > G:  # (a test's synthetic drafter states its γ by its drafts)
                return None
            n_drafts = [min(G, width)] * b if n_drafts is None else [min(G, n) for n in n_drafts]
        if not device and not any(n_drafts):
            return self._plain_step(batch, time.perf_counter())  # (it feeds a drafter's context ring)
        if not self.scheduler.reserve(batch, G):
            return None
        td = time.perf_counter() if drafts is not None else ts  # a device drafter's time is inside the step
        out = self.runner.speculate(self.drafter, [r.slot for r in batch], [r.length - 1 for r in batch],
                                    [r.output_ids[-1] for r in batch], G, max(r.length for r in batch) + G,
                                    drafts, n_drafts)
        return G, None, PendingTokens(out), td  # (real drafts per row: the result's last column)

    def _plain_step(self, batch, td: float) -> tuple[None, list[int], list[list[int]], float]:
        """A greedy step where no row has drafts: the plain decode step (its captured graph with graphs on)
        instead of a verify window of padding. G None marks it; each row keeps its one target token."""
        logits = self.runner.decode([r.slot for r in batch], [r.length - 1 for r in batch],
                                    [r.output_ids[-1] for r in batch], max(r.length for r in batch),
                                    ring=self.drafter if self.runner.hidden_layers else None)
        return None, [0] * len(batch), [[0, t] for t in logits.argmax(-1).tolist()], td  # the step's one host sync

    def _spec_eager(self, batch, draft: bool = True) -> tuple[int, list[int], list[list[int]], float]:
        """Draft, verify and commit op by op (any drafter, sampling rows); returns (drafts verified G, real drafts
        per row, rows [accepted, tokens...] read back, time the drafts were ready). draft=False: no drafts (a
        one-token verify per row, sampled from the target alone)."""
        dev, b = self.runner.device, len(batch)
        temp = torch.tensor([r.params.temperature for r in batch], dtype=torch.float32)
        sampling = bool((temp > 0).any())
        if draft:
            drafts, q, n_drafts = self.drafter.propose(batch, self.gamma, temp.to(dev, non_blocking=True),
                                                       self._draft_gen)
        else:
            drafts, q, n_drafts = torch.zeros(b, 0, dtype=torch.long, device=dev), None, None
        G = drafts.shape[1] if isinstance(drafts, torch.Tensor) else len(drafts[0])
        G0 = max(self.gamma, G)  # (a test's synthetic drafter states its γ by its drafts)
        if n_drafts is not None:
            G = min(G, max(n_drafts))
        # pages for the whole window before it runs; the rows grown before one that cannot keep their pages
        if G and not self.scheduler.reserve(batch, G):
            G = 0
        n_drafts = [G] * b if n_drafts is None else [min(n, G) for n in n_drafts]
        td = time.perf_counter()
        # sampling rows keep the window of one: their γ + 1 uniforms a step keep a row's draws batch-independent
        if G == 0 and not sampling and not self.runner.hidden_layers:
            return self._plain_step(batch, td)
        anchors = [r.output_ids[-1] for r in batch]
        if isinstance(drafts, torch.Tensor):
            win = torch.cat([pinned(torch.tensor(anchors, dtype=torch.long), dev).to(dev, non_blocking=True)[:, None],
                             drafts[:, :G]], 1)
        else:
            host = torch.tensor([[a, *d[:G]] for a, d in zip(anchors, drafts)], dtype=torch.long)
            win = pinned(host, dev).to(dev, non_blocking=True)
        logits = self.runner.verify([r.slot for r in batch], [r.length - 1 for r in batch], win,
                                    max(r.length for r in batch) + G)
        uniforms = None
        if sampling:  # γ + 1 per request and step whatever this batch's G: a row's draws do not depend on its batch
            u = self.sampler.uniforms(batch, G0 + 1)
            host = torch.cat([temp[:, None], torch.tensor([[r.params.top_p] for r in batch]),
                              torch.tensor([n_drafts], dtype=torch.float32).T, u[:, :G], u[:, G0:]], 1)
            host = pinned(host, dev).to(dev, non_blocking=True)
            t_dev, top_p, nd, uniforms = host[:, 0], host[:, 1], host[:, 2].long(), host[:, 3:]
        else:
            t_dev = top_p = None
            nd = pinned(torch.tensor(n_drafts, dtype=torch.long), dev).to(dev, non_blocking=True)
        m, toks = verify(logits, win[:, 1:], None if q is None or G == 0 else q[:, :G], t_dev, top_p, uniforms, nd)
        m, toks = self.drafter.decide(self.runner.rows[:b], self.runner.pos[:b], m, toks, nd)
        self.runner.commit(m + 1)  # anchor + accepted drafts enter the state, on the device
        if self.runner.hidden_layers:
            self.drafter.on_commit(batch, self.runner.hidden, self.runner.pos[:b], m + 1)
        return G, n_drafts, torch.cat([m[:, None], toks], 1).tolist(), td  # the step's one host sync
