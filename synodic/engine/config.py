"""`runtime` group: where the engine runs (local: this process; Ray executors plug in here)."""
from typing import Literal

from pydantic import Field, model_validator

from synodic.config.netcheck import RayAddress
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
        None, description="queue each greedy decode step (and speculative window, its anchors and positions "
        "taken on the device) before the previous step's tokens are read back (overlapped scheduling); null: on "
        "where the KV policy allows it (kv=resident or attention-free)")
    prefill_tokens: int = Field(
        4096, ge=1, description="prompt tokens per prefill forward: admitted requests of equal context length "
        "are prefilled together up to this many tokens (a longer one runs alone); KV policies with sparse "
        "prefill (hisparse, adaptive) prefill one request at a time")
    seed: int = Field(0, description="global torch seed")

    def executor(self, cfg):
        """Serves the run's requests in this process (synodic/engine/executor.py)."""
        from .executor import LocalExecutor
        return LocalExecutor(cfg)


@register("runtime")
class RayRuntime(LocalRuntime):
    """Data-parallel decode replicas as Ray actors: each builds the same validated graph on its own device
    (a GPU, or CPU replicas where the cluster has none) and serves the requests the router sends it; the
    driver holds no weights. The fields above apply to every replica."""
    kind: Literal["ray"] = "ray"
    replicas: int | None = Field(
        None, ge=1, description="decode replicas; null: one per GPU the Ray cluster has (a CPU-only cluster needs "
        "an explicit count of CPU replicas)")
    gpus_per_replica: int = Field(1, ge=1, description="GPUs per replica (1: each replica runs the whole model on "
                                  "one GPU; more needs tensor parallelism, which synodic does not have)")
    cpus_per_replica: int = Field(1, ge=1, description="CPUs per replica (its torch threads on a CPU replica, at most "
                                  "the cores of its machine)")
    address: RayAddress = Field(None, description="Ray cluster to join: 'auto', 'host:port' or 'ray://host:port'; "
                                "null: start a local Ray instance for the run")
    router: Literal["least_loaded", "round_robin"] = Field(
        "least_loaded", description="which replica takes the next requests: least_loaded = the fewest outstanding "
        "tokens (prompt + max_tokens of its unfinished requests) over the speed it has shown; round_robin = in "
        "turn; either way a chunk is sized to the replica's share of the measured speed")
    max_restarts: int = Field(1, ge=0, description="times Ray restarts a replica that died (its unfinished requests "
                              "are served again by the replicas alive); past that the replica is dropped")

    @model_validator(mode="after")
    def _one_gpu(self):
        if self.gpus_per_replica > 1:
            raise ValueError(f"runtime.gpus_per_replica={self.gpus_per_replica}: expected 1 (a replica spanning "
                             f"GPUs needs tensor parallelism, which synodic does not have)")
        if self.device == "cpu" and self.cuda_graphs:
            raise ValueError("runtime.cuda_graphs=true with runtime.device=cpu: expected false")
        return self

    def executor(self, cfg):
        """Replicas on Ray (synodic/distributed/replicas.py)."""
        from synodic.distributed.replicas import RayExecutor
        return RayExecutor(cfg)
