"""Whether a greedy speculative step drafts at all, or the batch runs plain decode steps instead.

A verify window of 1 + γ tokens over b rows costs more as b grows (at a few hundred rows it is compute-bound),
while what the drafts earn per row does not grow, so every drafter loses to plain decoding past some batch, and
a weak drafter loses everywhere. A gate decides per step from rates it holds; a closed gate sends the batch to
the overlapped plain loop and drafts again only to re-measure (a probe): after `wait` plain steps, where each
probe that still loses doubles the wait up to max_wait, so a batch where drafts cannot pay spends about one step
in max_wait on them; each winning drafting step halves it. Only the last `feed` plain steps before a probe hand a
neural drafter their features (`feeds`; the rest are exact plain steps). Greedy batches only: a sampled row's
draws are per speculative step.

Two gates share that schedule:
- `MeasuredGate` (here): every scheme. Per batch bucket (rows rounded up to a power of two, as CUDA graphs are
  captured), the tokens per second that the engine measured drafting steps and plain steps to produce; the bucket
  drafts while the first beats the second. Each rate is moving-average tokens over moving-average seconds per
  step, not an average of per-step rates, which would weigh the short steps of a chain over the synced step that
  starts it.
  It needs no profile, so it measures each side once per bucket: a drafting step first, then plain steps until
  one is timed.
- `load_aware.DraftGate`: load-aware DSpark with an SPS profile that prices draft and plain steps; it predicts
  both rates at any batch from the profile and the recent acceptance."""
import math


class Gate:
    """The probe schedule and counters; a subclass says whether drafting beats plain steps at b rows (`open`)."""

    def __init__(self, max_wait: int = 1024, feed: int = 64, probe_share: float = 0.02):
        self.max_wait, self.feed = max_wait, feed
        self.probe_share = probe_share  # the plain throughput a losing batch's probes may cost, at most
        self.wait, self.since = 1, 0         # plain steps between probes; plain steps since the last draft
        self.probes = 0                      # steps drafted while the gate was closed
        self.plain_steps = 0                 # plain steps run instead of drafting
        # seconds and count of the timed probes and plain steps: what a probe costs in plain steps, in results
        self._probe_t, self._plain_t = [0.0, 0], [0.0, 0]
        self._feed_t = [0.0, 0]  # plain steps that fed the drafter (timed apart: what feeding costs, in results)
        # bucket → timed drafting steps: a bucket's first may carry one-off work outside a graph capture (kernel
        # compiles, first allocations), so neither gate lets it alone price drafting there
        self._drafts_timed: dict[int, int] = {}

    def open(self, b: int) -> bool:
        raise NotImplementedError

    def drafts(self, b: int) -> bool:
        """Whether the next step over b rows drafts: the gate is open, or a probe is due."""
        return self.open(b) or self.since >= self.wait

    def feeds(self) -> bool:
        """Whether a plain step launched now feeds the drafter's context: one of the last `feed` before the probe
        (the plain loop launches a step before reading back the one in flight, which `since` does not count yet,
        so wait - since plain steps are still to run, this one included)."""
        return self.wait - self.since <= self.feed

    def _probe_excess(self, b: int) -> float | None:
        """Plain steps' worth of time a drafting step over b rows costs beyond the tokens it keeps (None: unknown)."""
        return None

    def _plain_ran(self, seconds: float | None, fed: bool = False) -> None:
        self.since += 1
        self.plain_steps += 1
        if seconds is not None and seconds > 0:
            t = self._feed_t if fed else self._plain_t
            t[0] += seconds
            t[1] += 1

    def _drafting_ran(self, b: int, seconds: float | None) -> None:
        """Before the step's rates are in: count it as a probe if the gate was closed (and its time)."""
        if seconds is not None and seconds > 0:
            self._drafts_timed[bucket(b)] = self._drafts_timed.get(bucket(b), 0) + 1
        if not self.open(b):
            self.probes += 1
            if seconds is not None and seconds > 0:
                self._probe_t[0] += seconds
                self._probe_t[1] += 1

    def _first_timed_draft(self, b: int) -> bool:
        """Whether the drafting step just timed over b rows is its bucket's first (provisional: see __init__)."""
        return self._drafts_timed.get(bucket(b), 0) == 1

    def _drafted(self, b: int) -> None:
        """After a drafting step's rates are in: the next probe's wait. A winning step halves it (not a reset: one
        lucky probe would otherwise reopen a losing batch to probes every step); a losing one doubles it, and at
        least to the wait at which a probe's excess cost is probe_share of the plain steps between probes, so a
        drafter far behind stops probing often at once instead of after a ramp of doublings."""
        if self.open(b):
            self.wait = max(1, self.wait // 2)
        else:
            wait, excess = 2 * self.wait, self._probe_excess(b)
            if excess is not None and excess > 0:
                wait = max(wait, math.ceil(excess / self.probe_share))
            self.wait = min(wait, self.max_wait)
        self.since = 0

    def summary(self) -> dict:
        return {"plain_steps": self.plain_steps, "probes": self.probes, "wait": self.wait, "feed": self.feed,
                "probe_ms": _mean_ms(self._probe_t), "plain_ms": _mean_ms(self._plain_t),
                "feed_steps_timed": self._feed_t[1], "feed_ms": _mean_ms(self._feed_t)}


def _mean_ms(t: list) -> float | None:
    """Mean milliseconds of a [seconds, count] sum (None before anything was timed)."""
    return 1e3 * t[0] / t[1] if t[1] else None


def bucket(b: int) -> int:
    return 1 << (max(b, 1) - 1).bit_length()


class MeasuredGate(Gate):
    """Drafting against plain steps by the rates the engine measured, per batch bucket (module docstring)."""

    def __init__(self, max_wait: int = 1024, feed: int = 64, decay: float = 0.2, probe_share: float = 0.02):
        super().__init__(max_wait, feed, probe_share)
        self.decay = decay
        # bucket → moving averages [tokens, seconds, steps seen] per step of drafting steps (kept tokens) and of
        # plain steps
        self._spec: dict[int, list[float]] = {}
        self._plain: dict[int, list[float]] = {}

    @property
    def spec(self) -> dict[int, float]:
        """Bucket → tokens / s of drafting steps."""
        return {k: t / s for k, (t, s, _) in self._spec.items()}

    @property
    def plain(self) -> dict[int, float]:
        """Bucket → tokens / s of plain steps."""
        return {k: t / s for k, (t, s, _) in self._plain.items()}

    def open(self, b: int) -> bool:
        k = bucket(b)
        if k not in self._spec:
            return True   # the drafter is what was asked for: measure it first
        if k not in self._plain:
            return False  # then plain steps until one is timed
        (ts, ss, _), (tp, sp, _) = self._spec[k], self._plain[k]
        return ts * sp > tp * ss

    def _probe_excess(self, b: int) -> float | None:
        k = bucket(b)
        if k not in self._spec or k not in self._plain or self._drafts_timed.get(k, 0) < 2:
            return None  # (the bucket's first timed drafting step is provisional: the wait only doubles)
        (ts, ss, _), (tp, sp, _) = self._spec[k], self._plain[k]
        return ss / sp - ts / tp  # a drafting step's time and its tokens, each in plain steps

    def drafts(self, b: int) -> bool:
        k = bucket(b)
        if k in self._spec and k not in self._plain:
            return False  # (no probe before the plain side has a rate to compare with)
        return super().drafts(b)

    def plain_step(self, b: int, seconds: float | None = None, fed: bool = False) -> None:
        """A plain step over b rows ran (in `seconds`, when timed: a step that captured a graph is not; `fed`: it
        fed the drafter's context)."""
        self._plain_ran(seconds, fed)
        if seconds is not None and seconds > 0:
            _average(self._plain, bucket(b), b, seconds, self.decay)

    def observe(self, b: int, kept: float, verified: float, seconds: float | None = None) -> None:
        """A drafting step over b rows kept `kept` tokens per row (in `seconds`, when timed)."""
        self._drafting_ran(b, seconds)
        if seconds is not None and seconds > 0:
            _average(self._spec, bucket(b), b * kept, seconds, self.decay)
        self._drafted(b)

    def summary(self) -> dict:
        spec, plain = self.spec, self.plain
        return {**super().summary(), "kind": "measured",
                "tokens_per_s": {str(k): {"drafting": spec.get(k), "plain": plain.get(k)}
                                 for k in sorted({*spec, *plain})}}


def _average(sums: dict, k: int, tokens: float, seconds: float, decay: float) -> None:
    """Moving averages of bucket k's tokens and seconds per step (their ratio is the bucket's rate), and how many
    steps they saw. The first step of a kind in a bucket also pays one-off work outside a graph capture (kernel
    compiles, first allocations), so the second replaces it instead of averaging with it."""
    if k not in sums or sums[k][2] == 1:
        sums[k] = [tokens, seconds, 1 if k not in sums else 2]
    else:
        t, s, n = sums[k]
        sums[k] = [t + decay * (tokens - t), s + decay * (seconds - s), n + 1]
