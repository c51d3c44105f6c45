"""DSpark's load-aware verification length: how many of each row's drafts to verify this step.

With calibrated per-position confidences c[r, j] ≈ P(draft j accepted | drafts < j accepted), the survival
a[r, j] = Π_{i≤j} c[r, i] is the probability that row r's draft j is accepted, so verifying lengths len_r
yields τ = Σ_r (1 + Σ_{j≤len_r} a[r, j]) tokens in expectation (the +1: each row's correction / bonus token)
from a forward over N = Σ_r (1 + len_r) tokens. With SPS(N) the target's verify steps per second at N batch
tokens (profiled once per model and device, stored as JSON: `SpsProfile`), the predicted throughput is
τ · SPS(N). Candidates (r, j) are admitted in decreasing survival (a row's survivals never increase with j,
so each row takes a prefix) while the throughput rises; the first non-improvement stops the admission."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise ConfigError([f"spec.verify=load_aware: {path} is not an SPS profile ({str(e).splitlines()[0]})"]) \
            from None


@dataclass
class SpsProfile:
    tokens: list[int]          # batch token counts measured (ascending)
    steps_per_s: list[float]   # verify forwards per second at each
    model: str = ""
    device: str = ""

    def __call__(self, n: int) -> float:
        """SPS at n tokens: linear interpolation, clamped to the measured range's ends."""
        return float(np.interp(n, self.tokens, self.steps_per_s))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps({"model": self.model, "device": self.device, "tokens": self.tokens,
                                          "steps_per_s": self.steps_per_s}, indent=1))

    @classmethod
    def load(cls, path) -> "SpsProfile":
        d = json.loads(Path(path).read_text())
        if len(d["tokens"]) != len(d["steps_per_s"]) or not d["tokens"] or sorted(d["tokens"]) != d["tokens"]:
            raise ValueError(f"{path}: expected ascending 'tokens' and one 'steps_per_s' per entry")
        return cls(list(d["tokens"]), [float(x) for x in d["steps_per_s"]], d.get("model", ""), d.get("device", ""))


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
