"""Executors: where a run's requests are served, built from the `runtime` group. The local executor
builds the serving graph and one engine in this process (CPU or one GPU); a distributed executor
(Ray replicas) implements the same `serve` and returns the same `Served`. `workers()` hands a pipeline
that drives the engine itself (pipeline=bench) the same replicas, to run its own functions on."""
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from .request import Request


@dataclass
class Served:
    requests: list[Request]  # every request, finished (outputs, finish reasons, timings)
    graph: object            # the ServingGraph the requests ran on (local: this process's)
    engine: object           # the Engine that served them: its ledger and timers feed the results


class LocalExecutor:
    """One ServingGraph and one Engine in this process."""

    def __init__(self, cfg):
        self.cfg = cfg

    def serve(self, requests: list[Request], max_seq_len: int, max_running: int | None = None,
              on_token: Callable[[Request, int], None] | None = None,
              progress: Callable[[int], None] | None = None) -> Served:
        from synodic.graph import build_graph

        from .engine import Engine
        graph = build_graph(self.cfg, max_seq_len)
        engine = Engine(graph, max_running=max_running)
        engine.generate(requests, on_token=on_token, progress=progress)
        return Served(requests, graph, engine)

    @contextmanager
    def workers(self):
        """This process as the run's one replica (LocalWorkers)."""
        yield LocalWorkers()


class LocalWorkers:
    """The executor's replicas as a pipeline drives them (here: this process, one replica): `call(fn, *args)`
    runs `fn(state, *args)` on every replica at once, `state` a dict each replica keeps between calls, and
    returns their results in replica order. synodic.distributed.replicas.RayWorkers is the same on Ray actors."""
    distributed = False
    n = 1
    pids = [os.getpid()]

    def __init__(self):
        self.state: dict = {}

    def call(self, fn, *args) -> list:
        return [fn(self.state, *args)]
