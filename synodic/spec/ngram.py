"""spec=ngram: prompt-lookup drafting on the host's token lists (no weights, no device work: a numpy scan
of each row's context per step, cheap beside a verify forward at the lengths the engine serves)."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


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


class NgramDrafter:
    """Drafter runtime for spec=ngram (the Engine's interface: see synodic/spec/runtime.py)."""
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, gamma: int, max_ngram: int, min_ngram: int):
        self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram

    def on_prefill(self, reqs, hidden) -> None:
        pass

    def propose(self, batch, gamma: int, temperature, generator):
        """(drafts [B, gamma] long on the device, q None (one-hot), real drafts per row [B] or None)."""
        rows = [lookup(r.context, gamma, self.max_ngram, self.min_ngram) for r in batch]
        n = [len(d) for d in rows]
        flat = [(d + [0] * gamma)[:gamma] for d in rows]
        return flat, None, n

    def on_commit(self, batch, hidden, start, accepted) -> None:
        pass

    def step_bytes(self, batch, lengths) -> dict[str, int]:
        return {}

    def summary(self) -> dict:
        return {"scheme": "ngram", "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}
