"""DSpark's load-aware verification length: how many of each row's drafts to verify this step.

With calibrated per-position confidences c[r, j] ≈ P(draft j accepted | drafts < j accepted), the survival
a[r, j] = Π_{i≤j} c[r, i] is the probability that row r's draft j is accepted, so verifying lengths len_r
yields τ = Σ_r (1 + Σ_{j≤len_r} a[r, j]) tokens in expectation (the +1: each row's correction / bonus token)
from a forward over N = Σ_r (1 + len_r) tokens. With SPS(N) the target's verify steps per second at N batch
tokens (profiled once per model and device, stored as JSON: `SpsProfile`), the predicted throughput is
τ · SPS(N). Candidates (r, j) are admitted in decreasing survival (a row's survivals never increase with j,
so each row takes a prefix) while the throughput rises; the first non-improvement stops the admission.

That rule prices the verify only: once the drafts exist their cost is spent. Whether to draft at all is
`DraftGate`'s call, made before the drafter runs, from the recent acceptance and the profile's rates of the
drafter's step and of a plain decode step: where speculation cannot pay at this batch, the engine runs plain
steps (overlapped, as without a drafter) and drafts again only to re-measure the acceptance."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gate import Gate

SPS_DIR = Path(__file__).resolve().parents[1] / "assets" / "sps"


def device_name(device) -> str:
    """The profile's device key: 'cpu', or the CUDA device's name in lower case with '-' for spaces."""
    import torch
    d = torch.device(device)
    if d.type != "cuda":
        return d.type
    return torch.cuda.get_device_name(d).lower().replace(" ", "-")


def profile_path(model: str, device) -> Path:
    return profile_file(model, device_name(device))


def profile_file(model: str, name: str) -> Path:
    """The profile of `model` on the device called `name` (device_name's form)."""
    return SPS_DIR / f"{model}-{name}.json"


def find_profile(model: str, device) -> "SpsProfile":
    """The shipped SPS profile of this model on this device; a one-line ConfigError naming the command that
    writes it when there is none."""
    from synodic.config.errors import ConfigError
    path = profile_path(model, device)
    if not path.is_file():
        raise ConfigError([f"spec.verify=load_aware: no SPS profile for model={model} on {device_name(device)} "
                           f"({path.name}); expected one: python -m benchmarks.sps_profile model={model}"])
    try:
        return SpsProfile.load(path)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ConfigError([f"spec.verify=load_aware: {path} is not an SPS profile ({str(e).splitlines()[0]})"]) \
            from None


@dataclass
class SpsProfile:
    tokens: list[int]          # batch token counts measured (ascending)
    steps_per_s: list[float]   # verify forwards per second at each
    model: str = ""
    device: str = ""
    # by batch (ascending rows): plain decode steps per second (queued back to back, as the overlapped loop runs
    # them) and load-aware draft steps per second (the drafter's graph, the read-back of its confidences and the
    # length choice). Absent in a profile written before the gate: then every step drafts.
    batches: list[int] | None = None
    plain_steps_per_s: list[float] | None = None
    draft_steps_per_s: list[float] | None = None

    def __call__(self, n: int) -> float:
        """SPS at n tokens: linear interpolation, clamped to the measured range's ends."""
        return float(np.interp(n, self.tokens, self.steps_per_s))

    @property
    def gates(self) -> bool:
        """Whether the profile prices the plain and draft steps (DraftGate needs both)."""
        return bool(self.batches) and self.plain_steps_per_s is not None and self.draft_steps_per_s is not None

    def plain(self, b: int) -> float:
        return float(np.interp(b, self.batches, self.plain_steps_per_s))

    def draft(self, b: int) -> float:
        return float(np.interp(b, self.batches, self.draft_steps_per_s))

    def save(self, path) -> None:
        d = {"model": self.model, "device": self.device, "tokens": self.tokens, "steps_per_s": self.steps_per_s}
        if self.gates:
            d.update(batches=self.batches, plain_steps_per_s=self.plain_steps_per_s,
                     draft_steps_per_s=self.draft_steps_per_s)
        Path(path).write_text(json.dumps(d, indent=1))

    @classmethod
    def load(cls, path) -> "SpsProfile":
        d = json.loads(Path(path).read_text())
        _ascending(path, d, "tokens", "steps_per_s")
        p = cls(list(d["tokens"]), [float(x) for x in d["steps_per_s"]], d.get("model", ""), d.get("device", ""))
        if "batches" in d:
            _ascending(path, d, "batches", "plain_steps_per_s", "draft_steps_per_s")
            p.batches = list(d["batches"])
            p.plain_steps_per_s = [float(x) for x in d["plain_steps_per_s"]]
            p.draft_steps_per_s = [float(x) for x in d["draft_steps_per_s"]]
        return p


def _ascending(path, d: dict, key: str, *values: str) -> None:
    if not d[key] or sorted(d[key]) != d[key] or any(len(d[v]) != len(d[key]) for v in values) or \
            any(float(x) <= 0 for v in values for x in d[v]):
        raise ValueError(f"{path}: expected ascending {key!r} and one positive value per entry in "
                         + ", ".join(repr(v) for v in values))


class DraftGate(Gate):
    """Whether a load-aware step drafts at all (the probe schedule: synodic/spec/gate.py): the predicted rate of
    speculating over b rows, b · kept / ((1 / draft(b) + 1 / SPS(b · verified)) · spec_cost), against plain
    decoding's b · plain(b) / plain_cost (SpsProfile's rates; kept and verified: moving averages of the tokens per
    row that recent drafting steps kept and verified). The profile times the device work of each step; spec_cost
    and plain_cost (moving averages of the engine's measured step time over the profile's, 1 until measured) add
    what it cannot see: the host's bookkeeping, which overlapped plain steps hide and drafting steps, read back
    mid-step, do not. The state carries across generate() calls: a server's acceptance is a property of its
    traffic, not of one batch."""

    def __init__(self, sps: SpsProfile, max_wait: int = 1024, decay: float = 0.5, cost_decay: float = 0.5,
                 plain_decay: float = 0.1, feed: int = 64, probe_share: float = 0.02):
        super().__init__(max_wait, feed, probe_share)
        self.sps, self.decay = sps, decay
        self.cost_decay, self.plain_decay = cost_decay, plain_decay  # 0: price steps by the profile alone
        self.kept: float | None = None      # tokens kept per row-step (accepted drafts + 1)
        self.verified: float | None = None  # tokens verified per row-step (chosen drafts + 1)
        self.spec_cost = self.plain_cost = 1.0  # measured step time / the profile's
        self._spec_key, self._spec_val, self._plain_rate = None, 0.0, {}

    def _spec_s(self, b: int, verified: float) -> float:
        # one entry: the plain loop asks at every step, and b and verified change only between drafting steps
        if self._spec_key != (b, verified):
            self._spec_key = (b, verified)
            self._spec_val = 1.0 / self.sps.draft(b) + 1.0 / self.sps(b * verified)
        return self._spec_val

    def _plain(self, b: int) -> float:
        if b not in self._plain_rate:  # (np.interp costs microseconds a call, on the host between plain steps)
            self._plain_rate[b] = self.sps.plain(b)
        return self._plain_rate[b]

    def rates(self, b: int) -> tuple[float, float]:
        """(predicted tokens/s speculating, tokens/s of plain steps) at b rows."""
        spec = b * self.kept / (self._spec_s(b, self.verified) * self.spec_cost)
        return spec, b * self._plain(b) / self.plain_cost

    def open(self, b: int) -> bool:
        """Whether drafting over b rows is predicted to beat plain steps (True before anything is measured)."""
        if self.kept is None:
            return True
        spec, plain = self.rates(b)
        return spec > plain

    def _probe_excess(self, b: int) -> float | None:
        if self.kept is None:
            return None
        plain_s = self.plain_cost / self._plain(b)
        return self._spec_s(b, self.verified) * self.spec_cost / plain_s - self.kept

    def plain_step(self, b: int, seconds: float | None = None, fed: bool = False) -> None:
        """A plain step over b rows ran (in `seconds`, when timed: a step that captured a graph is not; `fed`: it
        fed the drafter's context)."""
        self._plain_ran(seconds, fed)
        if seconds is not None:
            self.plain_cost += self.plain_decay * (_ratio(seconds * self._plain(b)) - self.plain_cost)

    def observe(self, b: int, kept: float, verified: float, seconds: float | None = None) -> None:
        """A drafting step over b rows kept / verified these mean tokens per row (in `seconds`, when timed)."""
        self._drafting_ran(b, seconds)
        if self.kept is None:
            self.kept, self.verified = kept, verified
        else:
            self.kept += self.decay * (kept - self.kept)
            self.verified += self.decay * (verified - self.verified)
        # a bucket's first timed drafting step is provisional (Gate): the profile alone prices it
        if seconds is not None and not self._first_timed_draft(b):
            self.spec_cost += self.cost_decay * (_ratio(seconds / self._spec_s(b, verified)) - self.spec_cost)
        self._drafted(b)

    def summary(self) -> dict:
        return {**super().summary(), "kind": "sps_profile", "kept_per_row": self.kept,
                "verified_per_row": self.verified, "spec_cost": self.spec_cost, "plain_cost": self.plain_cost}


def _ratio(r: float) -> float:
    """A measured / profiled time ratio, bounded: one step timed across a host stall (or a clock glitch) moves the
    average by at most a bounded amount, and a cost never reaches zero (the rates divide by it)."""
    return min(max(r, 0.01), 100.0)


def choose_lengths(confidence: np.ndarray, sps) -> tuple[np.ndarray, float]:
    """confidence [B, G] → (drafts to verify per row [B], predicted tokens per second)."""
    c = np.asarray(confidence, dtype=np.float64)
    B, G = c.shape
    surv = np.cumprod(c, axis=1)
    order = np.lexsort((np.tile(np.arange(G), B), -surv.ravel()))  # by survival, then position
    lengths = np.zeros(B, dtype=np.int64)
    tau, n = float(B), B
    best = tau * sps(n)
    for flat in order:
        r, j = divmod(int(flat), G)
        if j != lengths[r]:  # (equal survivals out of order: a row's next draft must be its next position)
            continue
        cand = (tau + surv[r, j]) * sps(n + 1)
        if cand <= best:
            break
        tau, n, best = tau + surv[r, j], n + 1, cand
        lengths[r] += 1
    return lengths, best


def choose_lengths_reference(confidence, sps) -> tuple[list[int], float]:
    """Plain loops: admit the best remaining next draft of any row while the throughput rises."""
    B, G = len(confidence), len(confidence[0])
    lengths, surv_next = [0] * B, [float(confidence[r][0]) for r in range(B)]
    tau, n = float(B), B
    best = tau * sps(n)
    while True:
        live = [r for r in range(B) if lengths[r] < G]
        if not live:
            return lengths, best
        r = max(live, key=lambda i: (surv_next[i], -lengths[i], -i))
        cand = (tau + surv_next[r]) * sps(n + 1)
        if cand <= best:
            return lengths, best
        tau, n, best = tau + surv_next[r], n + 1, cand
        lengths[r] += 1
        if lengths[r] < G:
            surv_next[r] *= float(confidence[r][lengths[r]])
