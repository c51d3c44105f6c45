"""`runtime=ray`: data-parallel decode replicas as Ray actors.

Each replica is an actor in its own bundle of one placement group (PACK across bundles), builds the run's
validated graph on its device, warms up (one short request, so a GPU replica has captured its first graph),
and serves the chunks of requests the driver sends it with the same Engine as `runtime=local`. The driver
keeps the queue: a router picks the replica for the next chunk (least outstanding tokens in the time that
replica needs for them, or round robin), at most two chunks are on a replica at a time (one until its first
chunk has shown its speed), and a chunk is sized to the replica's share of the replicas' measured speed, so
a slow replica is not left with a long queue while the others are idle. A replica that dies (its process
killed, a CUDA error, its node gone) fails its chunks; those requests go back to the front of the queue and
are served again from their prompt by whichever replica is alive (greedy outputs are the same), while Ray
restarts the actor up to `runtime.max_restarts` times. When no replica is left, the requests not finished end as
`failed_replica_lost`: the run never hangs and never drops a request silently.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

from synodic.config.errors import ConfigError
from synodic.engine.executor import Served
from synodic.engine.ledger import ByteLedger
from synodic.engine.request import Request, Status
from synodic.spec.stats import SpecStats

PLACE_TIMEOUT_S = 60.0  # a cluster that cannot place the replicas by then will not (no autoscaler here)
IN_FLIGHT_PER_REPLICA = 2  # chunks queued on one replica: the next one is there when the current one ends
LOST = "failed_replica_lost"


def _wall(t: float | None, perf_now: float, wall_now: float) -> float | None:
    """A perf_counter time of this process as wall time (clocks of two processes only agree on wall time)."""
    return None if t is None else t - perf_now + wall_now


def _threads(cpus: int) -> int:
    """Torch threads of a replica given `cpus` logical CPUs: at most the cores of its machine (Ray's CPUs are a
    scheduling unit, so runtime.cpus_per_replica may exceed them; more threads than cores only contend)."""
    import os
    return max(1, min(cpus, os.cpu_count() or 1))


class Replica:
    """One decode replica: a ServingGraph and an Engine on the device Ray gave this actor."""

    def __init__(self, raw_cfg: dict, max_seq_len: int, max_running: int | None, threads: int):
        import torch

        from synodic.config.schema import validate
        from synodic.engine.engine import Engine
        from synodic.graph import build_graph
        torch.set_num_threads(_threads(threads))
        t0 = time.perf_counter()
        self.cfg = validate(raw_cfg)
        self.graph = build_graph(self.cfg, max_seq_len)
        self.engine = Engine(self.graph, max_running=max_running)
        self.build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = Request(-1, [0, 1, 2], _params(max_tokens=2))
        self.engine.generate([warm])  # compiles kernels, captures the batch-1 graph on a GPU
        self.warmup_s = time.perf_counter() - t0
        self._reset_counters()
        self.served = 0

    def _reset_counters(self) -> None:
        e = self.engine
        e.ledger, e.decode_s, e.prefill_s, e.prefill_forwards = ByteLedger(), 0.0, 0.0, 0
        e.spec_stats = SpecStats()  # the warm-up's speculative steps are not the run's
        e.scheduler.finished.clear()

    def pid(self) -> int:
        return os.getpid()

    def serve(self, requests: list[Request]) -> list[Request]:
        """The chunk served to completion; timestamps returned as wall time."""
        self.engine.generate(requests)
        perf_now, wall_now = time.perf_counter(), time.time()
        for r in requests:
            r.arrival_s = _wall(r.arrival_s, perf_now, wall_now)
            r.first_token_s = _wall(r.first_token_s, perf_now, wall_now)
            r.finish_s = _wall(r.finish_s, perf_now, wall_now)
        self.served += len(requests)
        return requests

    def summary(self) -> dict:
        e, g = self.engine, self.graph
        return {"pid": os.getpid(), "device": str(g.device), "requests": self.served,
                "decode_tokens": e.ledger.tokens, "decode_s": e.decode_s, "prefill_s": e.prefill_s,
                "prefill_forwards": e.prefill_forwards, "capture_s": e.runner.capture_s,
                "build_s": self.build_s, "warmup_s": self.warmup_s,
                "decode_tokens_per_s": e.ledger.tokens / e.decode_s if e.decode_s else 0.0,
                "cuda_graphs": g.cuda_graphs, "notes": g.notes,
                "quant": g.quant.summary() if g.quant is not None else None,
                "ledger_totals": {"steps": e.ledger.steps, "tokens": e.ledger.tokens, **e.ledger.totals},
                "ledger": e.ledger.summary(),
                "spec": None if e.drafter is None else {"counters": dict(vars(e.spec_stats)), "gamma": e.gamma,
                                                        "drafter": e.drafter.summary()}}


class Worker:
    """A replica that runs a pipeline's own functions on its device: `call(fn, *args)` runs `fn(state, *args)`,
    `state` a dict this actor keeps between calls (what fn builds there, e.g. a graph, stays on the device)."""

    def __init__(self, threads: int):
        import torch
        torch.set_num_threads(_threads(threads))
        self.state: dict = {}

    def pid(self) -> int:
        return os.getpid()

    def call(self, fn, *args):
        return fn(self.state, *args)


class RayWorkers:
    """The driver's handle on the Worker replicas: each `call` runs on every replica at once and returns when all
    have finished (their results in replica order), so what the replicas time in one call overlaps."""
    distributed = True

    def __init__(self, ray, slots: list[_Slot], pids: list[int]):
        self.ray, self.slots, self.pids = ray, slots, pids

    @property
    def n(self) -> int:
        return len(self.slots)

    def call(self, fn, *args) -> list:
        ray = self.ray
        refs = [s.actor.call.remote(fn, *args) for s in self.slots]
        out = []
        for s, ref in zip(self.slots, refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayTaskError as e:  # fn raised there: the same error here (a ConfigError is exit 2)
                raise e.cause from None
            except ray.exceptions.RayActorError:
                raise RuntimeError(f"runtime=ray: replica {s.index} (pid {self.pids[s.index]}) died during "
                                   f"{getattr(fn, '__name__', fn)}; every replica's part of the call is needed, "
                                   "so it is not served again elsewhere") from None
        return out


def _params(**kw):
    from synodic.engine.request import SamplingParams
    return SamplingParams(**kw)


@dataclass
class _Slot:
    """The driver's view of one replica."""
    actor: object
    index: int
    alive: bool = True
    failures: int = 0
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> chunk (list of the driver's Requests)
    work: int = 0        # prompt + max_tokens of the chunks it finished ...
    busy_s: float = 0.0  # ... and the seconds it spent serving them (its own clock)

    def outstanding(self) -> int:
        return sum(_work(c) for c in self.in_flight.values())

    def speed(self) -> float | None:
        """Work a second this replica has shown (None before its first chunk)."""
        return self.work / self.busy_s if self.busy_s > 0 else None


def _work(chunk: list[Request]) -> int:
    return sum(len(r.prompt_ids) + r.params.max_tokens for r in chunk)


def _speeds(slots: list[_Slot]) -> dict[int, float]:
    """Each live replica's speed; one not measured yet counts as the mean of those measured (all equal at first)."""
    live = [s for s in slots if s.alive]
    known = [v for v in (s.speed() for s in live) if v is not None]
    guess = sum(known) / len(known) if known else 1.0
    return {s.index: s.speed() or guess for s in live}


class _DrafterSummary:
    """The replicas' drafter as the pipelines read it (its summary)."""

    def __init__(self, summary: dict):
        self._summary = summary

    def summary(self) -> dict:
        return self._summary


def _merged_spec(specs: list[dict | None]):
    """(drafter stand-in or None, γ, SpecStats summed over the replicas): counters add, per-position lists add
    position by position."""
    stats = SpecStats()
    live = [s for s in specs if s is not None]
    if not live:
        return None, 0, stats
    for s in live:
        for k, v in s["counters"].items():
            if isinstance(v, list):
                cur = getattr(stats, k)
                cur.extend([0] * (len(v) - len(cur)))
                setattr(stats, k, [a + b for a, b in zip(cur, v + [0] * (len(cur) - len(v)))])
            else:
                setattr(stats, k, getattr(stats, k) + v)
    return _DrafterSummary(live[0]["drafter"]), live[0]["gamma"], stats


class _Merged:
    """What the pipelines read of a local run's graph and engine, summed over the replicas."""

    class _Runner:
        def __init__(self, capture_s):
            self.capture_s = capture_s

    class _Quant:
        def __init__(self, summary):
            self._summary = summary

        def summary(self):
            return self._summary

    def __init__(self, summaries: list[dict], codec, ckpt_dir, n_replicas: int):
        self.ledger = ByteLedger()
        for s in summaries:
            t = dict(s["ledger_totals"])
            self.ledger.steps += t.pop("steps")
            self.ledger.tokens += t.pop("tokens")
            for k, v in t.items():
                self.ledger.totals[k] += v
        rate = sum(s["decode_tokens_per_s"] for s in summaries)
        # replicas decode in parallel: the combined rate is the sum of theirs, so decode_s is the time at that rate
        self.decode_s = self.ledger.tokens / rate if rate else 0.0
        self.prefill_s = sum(s["prefill_s"] for s in summaries)
        self.prefill_forwards = sum(s["prefill_forwards"] for s in summaries)
        self.runner = self._Runner(sum(s["capture_s"] for s in summaries))
        self.replicas = summaries
        self.codec, self.ckpt_dir = codec, ckpt_dir
        self.device = f"ray: {n_replicas} replicas ({', '.join(sorted({s['device'] for s in summaries}))})"
        self.cuda_graphs = any(s["cuda_graphs"] for s in summaries)
        self.notes = sorted({n for s in summaries for n in s["notes"]})
        self.drafter, self.gamma, self.spec_stats = _merged_spec([s.get("spec") for s in summaries])
        q = next((s["quant"] for s in summaries if s["quant"] is not None), None)
        self.quant = self._Quant(q) if q is not None else None


class RayExecutor:
    """Serves a run's requests on `runtime.replicas` Ray actors (see the module docstring)."""

    def __init__(self, cfg, on_dispatch=None):
        self.cfg = cfg
        self.on_dispatch = on_dispatch  # (replica index, chunk, pids) after each dispatch: tests' fault hook

    def _plan(self, resources: dict) -> tuple[int, float]:
        """(replicas, GPUs each), checked against the cluster's resources before any actor starts."""
        rt = self.cfg.runtime
        gpus = int(resources.get("GPU", 0))
        use_gpu = rt.device != "cpu" and gpus > 0
        if rt.device == "cuda" and gpus == 0:
            raise ConfigError(["runtime.device='cuda': the Ray cluster has no GPU; expected runtime.device=cpu or "
                               "auto, or a cluster with GPUs"])
        n = rt.replicas
        if n is None:
            if not use_gpu:
                raise ConfigError(["runtime.replicas=null: the Ray cluster has no GPU to count replicas by; "
                                   "expected runtime.replicas=N (N CPU replicas)"])
            n = gpus // rt.gpus_per_replica
        if use_gpu and n * rt.gpus_per_replica > gpus:
            raise ConfigError([f"runtime.replicas={n}: the Ray cluster has {gpus} GPU(s), {rt.gpus_per_replica} per "
                               f"replica; expected runtime.replicas <= {gpus // rt.gpus_per_replica}"])
        return n, float(rt.gpus_per_replica) if use_gpu else 0.0

    @contextmanager
    def _replicas(self, cls, *args):
        """(ray, slots): `runtime.replicas` actors of `cls(*args, threads)`, each in its bundle of one placement
        group, built before the block runs; the cluster is checked first (_plan) and every actor and the group
        go when the block ends."""
        from synodic.distributed.cluster import ray_session
        rt = self.cfg.runtime
        n_cpu = (rt.replicas or 1) * rt.cpus_per_replica
        if not rt.address:  # a local instance has this machine's GPUs: decided before Ray starts (and logs)
            import torch
            self._plan({"GPU": torch.cuda.device_count()})
        with ray_session(rt.address, "runtime.address", num_cpus=n_cpu) as ray:
            n, gpus = self._plan(ray.cluster_resources())
            pg = self._place(ray, n, gpus)
            slots = []
            try:
                slots = self._start(ray, pg, n, gpus, cls, args)
                yield ray, slots
            finally:  # the run's actors and reserved resources go; a joined cluster keeps running
                for s in slots:
                    ray.kill(s.actor, no_restart=True)
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(pg)

    def serve(self, requests: list[Request], max_seq_len: int, max_running: int | None = None,
              on_token=None, progress=None) -> Served:
        rt = self.cfg.runtime
        raw = self.cfg.model_dump(mode="json")
        with self._replicas(Replica, raw, max_seq_len, max_running) as (ray, slots):
            self._route(ray, slots, requests, max_running or rt.max_slots, on_token, progress)
            summaries = []
            for s in slots:
                if s.alive:
                    try:
                        summaries.append({"replica": s.index, **ray.get(s.actor.summary.remote())})
                    except ray.exceptions.RayActorError:
                        s.alive = False
        from synodic.engine.text import load_codec
        from synodic.graph import checkpoint_dir
        ckpt = checkpoint_dir(self.cfg.model)
        merged = _Merged(summaries, load_codec(ckpt), ckpt, len(slots))
        return Served(requests, merged, merged)

    @contextmanager
    def workers(self):
        """Replicas that run a pipeline's own functions (Workers, below), for the block."""
        with self._replicas(Worker) as (ray, slots):
            yield RayWorkers(ray, slots, self.pids)

    def _place(self, ray, n: int, gpus: float):
        """One bundle per replica, packed; refused in one line when the cluster cannot hold them."""
        from ray.util.placement_group import placement_group, remove_placement_group
        rt = self.cfg.runtime
        bundle = {"CPU": rt.cpus_per_replica, **({"GPU": gpus} if gpus else {})}
        pg = placement_group([bundle] * n, strategy="PACK")
        if not pg.wait(timeout_seconds=PLACE_TIMEOUT_S):
            remove_placement_group(pg)
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            raise ConfigError([f"runtime.replicas={n}: the Ray cluster cannot place {n} x {bundle} within "
                               f"{PLACE_TIMEOUT_S:.0f} s (available now: {free}); expected fewer replicas or "
                               f"runtime.cpus_per_replica / gpus_per_replica that fit"])
        return pg

    def _start(self, ray, pg, n: int, gpus: float, cls, args: tuple) -> list[_Slot]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        rt = self.cfg.runtime
        remote = ray.remote(cls)
        slots = []
        for i in range(n):
            actor = remote.options(
                num_cpus=rt.cpus_per_replica, num_gpus=gpus, max_restarts=rt.max_restarts, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote(*args, rt.cpus_per_replica)
            slots.append(_Slot(actor, i))
        self.pids = ray.get([s.actor.pid.remote() for s in slots])  # every replica built (and warmed up)
        return slots

    def _pick(self, slots: list[_Slot], turn: int, speeds: dict[int, float]) -> _Slot | None:
        # one chunk on a replica until it has shown its speed: a slow one does not start with two full chunks
        free = [s for s in slots if s.alive and len(s.in_flight) < (IN_FLIGHT_PER_REPLICA if s.busy_s else 1)]
        if not free:
            return None
        if self.cfg.runtime.router == "round_robin":
            return min(free, key=lambda s: ((s.index - turn) % len(slots), s.index))
        # the fewest outstanding tokens, in the time this replica needs for them (replicas differ in speed)
        return min(free, key=lambda s: (s.outstanding() / speeds[s.index], len(s.in_flight), s.index))

    def _route(self, ray, slots: list[_Slot], requests: list[Request], chunk_max: int, on_token, progress):
        queue = deque(requests)
        t0 = time.perf_counter()
        wall0 = time.time()
        for r in requests:
            r.arrival_s = t0
        turn = 0
        while True:
            while queue:
                speeds = _speeds(slots)
                s = self._pick(slots, turn, speeds)
                if s is None:
                    break
                # a chunk sized to the replica's share of the speed: near the end of the queue a slow replica
                # gets a few requests, not a full chunk that keeps the run going after the others are idle
                share = speeds[s.index] / sum(speeds.values())
                size = max(1, min(chunk_max, math.ceil(len(queue) * share / IN_FLIGHT_PER_REPLICA)))
                chunk = [queue.popleft() for _ in range(min(size, len(queue)))]
                s.in_flight[s.actor.serve.remote(chunk)] = chunk
                turn = s.index + 1
                if self.on_dispatch is not None:
                    self.on_dispatch(s.index, chunk, self.pids)
            refs = {ref: s for s in slots for ref in s.in_flight}
            if not refs:
                break
            done, _ = ray.wait(list(refs), num_returns=1)
            s = refs[done[0]]
            chunk = s.in_flight.pop(done[0])
            try:
                served = ray.get(done[0])
            except ray.exceptions.RayActorError:
                s.failures += 1
                if s.failures > self.cfg.runtime.max_restarts:
                    s.alive = False
                queue.extendleft(reversed(chunk))  # served again from their prompt, first in line
                if not any(x.alive for x in slots):
                    for x in slots:
                        for c in x.in_flight.values():
                            queue.extend(c)
                        x.in_flight.clear()
                    for r in queue:
                        r.status, r.finish_reason = Status.FINISHED, LOST
                    break
                continue
            ends = [r.finish_s for r in served if r.finish_s is not None]
            if ends:  # the replica's serve time of the chunk, on its own clock (wall time, as returned)
                s.work += _work(served)
                s.busy_s += max(ends) - min(r.arrival_s for r in served)
            for mine, theirs in zip(chunk, served):
                self._adopt(mine, theirs, t0, wall0, on_token)
            if progress is not None:
                progress(sum(len(r.output_ids) for r in served))

    @staticmethod
    def _adopt(mine: Request, theirs: Request, t0: float, wall0: float, on_token) -> None:
        """A served request's outputs and times copied into the driver's object (times back on the driver's
        perf_counter; arrival is when the driver took the request, so TTFT includes the queue)."""
        to_perf = lambda w: None if w is None else w - wall0 + t0  # noqa: E731
        mine.output_ids, mine.status, mine.finish_reason = theirs.output_ids, theirs.status, theirs.finish_reason
        mine.preemptions, mine.arrival_s = theirs.preemptions, t0
        mine.first_token_s, mine.finish_s = to_perf(theirs.first_token_s), to_perf(theirs.finish_s)
        if on_token is not None:
            for tok in mine.output_ids:
                on_token(mine, tok)
