"""Teacher-forced scoring through the serving path: the first token is prefilled, every later one
goes through a decode step of the state backend and KV policy (what differs between ssm=eager and
ssm=replay, or between KV policies), so the logits are the ones decoding would see."""
import torch

from .runner import ModelRunner
from .scheduler import Scheduler


class DecodePathScorer:
    """scorer(x [b, T]) → logits [b, T, V], row i in slot i; callable like a model's forward."""

    def __init__(self, graph, progress: bool = False):
        self.graph, self.progress = graph, progress
        self._memo: dict[bytes, torch.Tensor] = {}  # eval scores the same windows for NLL and KL
        self.runner = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device,
                                  graph.cuda_graphs)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = x.cpu().numpy().tobytes() + bytes(str(tuple(x.shape)), "ascii")
        if key not in self._memo:
            self._memo[key] = self._score(x)
        return self._memo[key]

    def _score(self, x: torch.Tensor) -> torch.Tensor:
        b, T = x.shape
        if b > self.graph.max_slots:
            raise ValueError(f"batch {b} exceeds the graph's {self.graph.max_slots} slots")
        rows = x.tolist()
        slots = list(range(b))
        Scheduler(self.graph.max_slots, self.graph.kv.blocks if self.graph.kv is not None else None,
                  self.graph.max_slots).hold(slots, T)
        firsts = [r[:1] for r in rows]
        if self.runner.batched_prefill:
            first = self.runner.prefill_batch(slots, firsts)[:, None]  # [b, 1, V]
        else:
            first = torch.stack([self.runner.prefill(s, firsts[s])[None] for s in slots])
        steps = []
        positions = range(1, T)
        if self.progress:  # a 2048-token window is 2047 decode steps: show them
            from rich.progress import track
            positions = track(positions, description="teacher-forced decode", transient=True)
        for t in positions:
            steps.append(self.runner.decode(slots, [t] * b, [r[t] for r in rows], t + 1).float())
        return torch.cat([first.float(), torch.stack(steps, 1)], 1) if steps else first.float()
