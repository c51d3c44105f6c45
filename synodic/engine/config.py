"""`runtime` group: where the engine runs (local: this process; Ray executors plug in here)."""
from typing import Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("runtime")
class LocalRuntime(Component):
    """In-process execution on the CPU or one GPU."""
    kind: Literal["local"] = "local"
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda if present, else cpu")
    max_slots: int = Field(64, ge=1, description="SSM state slots = max sequences decoding at once")
    cuda_graphs: bool | None = Field(
        None, description="capture decode steps in CUDA graphs; null: on when running on a GPU")
    overlap: bool | None = Field(
        None, description="queue each greedy decode step before the previous step's tokens are read back "
        "(overlapped scheduling); null: on where the KV policy allows it (kv=resident or attention-free)")
    prefill_tokens: int = Field(
        4096, ge=1, description="prompt tokens per prefill forward: admitted requests of equal context length "
        "are prefilled together up to this many tokens (a longer one runs alone); KV policies with sparse "
        "prefill (hisparse, adaptive) prefill one request at a time")
    seed: int = Field(0, description="global torch seed")

    def executor(self, cfg):
        """Serves the run's requests in this process (synodic/engine/executor.py)."""
        from .executor import LocalExecutor
        return LocalExecutor(cfg)
