"""spec=ngram: prompt-lookup drafting on the host's token lists (no weights, no device work).

`lookup` is the rule as a numpy scan of the whole context; the drafter keeps an incremental index per request
instead (`NgramIndex`: for each n, the latest start of every n-gram seen), updated by the tokens appended since
the last step, so a step costs a few dictionary lookups per row rather than a scan of its context — the scan
was ~0.25 ms a row, the whole host side of a captured speculative step at batch 32."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .runtime import Drafter


def lookup(context: list[int], gamma: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Drafts for one context: the longest suffix of n tokens (max_ngram ≥ n ≥ min_ngram) that also occurs
    earlier; the up to gamma tokens that followed its latest earlier occurrence ([] when nothing matches)."""
    a = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, len(a) - 1), min_ngram - 1, -1):
        suffix = a[-n:]
        win = sliding_window_view(a[:-1], n)  # every earlier n-gram start; the suffix itself is excluded
        hits = np.flatnonzero((win == suffix).all(-1))
        if hits.size:
            start = int(hits[-1]) + n
            return a[start:start + gamma].tolist()
    return []


class NgramIndex:
    """One request's n-grams (min_ngram..max_ngram): for each n, n-gram → latest start among those that end
    before the context's last token (the suffix itself is never its own match). Equal to `lookup` for any
    context that only grows."""

    def __init__(self, max_ngram: int, min_ngram: int):
        self.ns = range(min_ngram, max_ngram + 1)
        self._clear()

    def _clear(self) -> None:
        self.seen: dict[int, dict[tuple, int]] = {n: {} for n in self.ns}
        self.ends = 0  # n-grams ending at indices < ends are indexed

    def drafts(self, context: list[int], gamma: int) -> list[int]:
        L = len(context)
        if L - 1 < self.ends:  # not a continuation of what was indexed: start over
            self._clear()
        for e in range(self.ends, L - 1):  # index the n-grams ending at e (every e <= L - 2)
            for n in self.ns:
                if e + 1 >= n:
                    self.seen[n][tuple(context[e + 1 - n: e + 1])] = e + 1 - n
        self.ends = max(self.ends, L - 1)
        for n in reversed(self.ns):
            if n > L - 1:
                continue
            start = self.seen[n].get(tuple(context[L - n:]))
            if start is not None:
                return context[start + n: start + n + gamma]
        return []


class NgramDrafter(Drafter):
    """Drafter runtime for spec=ngram (the Engine's interface: see synodic/spec/runtime.py). A step queued from
    host tokens drafts from the host index (and a step where no row matches runs as a plain step); a step queued
    behind one still in flight drafts the same tokens on the device, from the runner's token history."""
    stages_drafts = True  # its host drafts fill the captured step's fixed window (rows short of γ are padding)
    uses_history = True
    chains = True

    def __init__(self, gamma: int, max_ngram: int, min_ngram: int, gate=None):
        self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
        self.gate = gate  # a synodic.spec.gate.MeasuredGate (spec.gate=auto) or None
        self._index: dict[int, NgramIndex] = {}  # request id → its n-gram index

    def on_prefill(self, reqs, hidden) -> None:
        """A prefill starts (or, after preemption, restarts) a request's context: an index left under its id by
        an earlier request with the same id would draft from that request's text."""
        for r in reqs:
            self._index.pop(r.id, None)

    def propose(self, batch, gamma: int, temperature, generator):
        """(drafts [B, gamma] long on the device, q None (one-hot), real drafts per row [B] or None)."""
        if len(self._index) > 2 * len(batch) + 64:  # finished requests' indexes go
            live = {r.id for r in batch}
            self._index = {k: v for k, v in self._index.items() if k in live}
        rows = []
        for r in batch:
            ix = self._index.get(r.id)
            if ix is None:
                ix = self._index[r.id] = NgramIndex(self.max_ngram, self.min_ngram)
            rows.append(ix.drafts(r.context, gamma))
        n = [len(d) for d in rows]
        flat = [(d + [0] * gamma)[:gamma] for d in rows]
        return flat, None, n

    def draft_device(self, slots, anchors, positions, gamma: int):
        """The device twin of propose: (drafts [B, gamma], real drafts per row [B]) by the same lookup."""
        from .models.lookup import history_hints
        hints = history_hints(self.history, slots, anchors, positions, gamma, self.max_ngram, self.min_ngram)
        return hints.clamp(min=0), (hints >= 0).sum(1)

    def summary(self) -> dict:
        return {"scheme": "ngram", "max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                **({} if self.gate is None else {"gate": self.gate.summary()})}
