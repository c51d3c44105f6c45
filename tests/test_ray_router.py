"""runtime=ray's driver side without a Ray instance: the router's balance over replicas of unequal speed, served
through a simulated cluster (each replica works through its chunks in order, one token at a time at its own
rate), and the cluster checks that refuse a run before any actor starts."""
import random
from contextlib import contextmanager

import pytest

from synodic.config.compose import compose
from synodic.config.errors import ConfigError
from synodic.distributed.replicas import RayExecutor, _Slot
from synodic.engine.request import Request, SamplingParams, Status

FEW = 4  # requests one replica may have waiting while another is idle


class _Ref:
    def __init__(self, actor, chunk, start, end):
        self.actor, self.chunk, self.start, self.end = actor, chunk, start, end


class _Sim:
    """ray as _route uses it: serve.remote queues a chunk on its replica; wait returns the next to finish."""

    class exceptions:
        class RayActorError(Exception):
            pass

    def __init__(self, total: int):
        self.now, self.total, self.dispatched, self.refs, self.idle_checks = 0.0, total, 0, [], 0

    def wait(self, refs, num_returns=1):
        self._check_balance()
        first = min(refs, key=lambda r: (r.end, r.actor.index))
        self.now = first.end
        self.refs.remove(first)
        return [first], [r for r in refs if r is not first]

    def get(self, ref):
        for r in ref.chunk:  # the replica's times (wall clock), as Replica.serve returns them
            r.output_ids, r.status, r.finish_reason = [0] * r.params.max_tokens, Status.FINISHED, "length"
            r.arrival_s, r.finish_s = ref.start, ref.end
        return ref.chunk

    def _check_balance(self):
        """After the driver has routed: a replica with nothing left to do while requests wait elsewhere is the
        imbalance the router must keep small."""
        busy = {r.actor.index for r in self.refs}
        for a in self.actors:
            if a.index in busy:
                continue
            self.idle_checks += 1
            assert self.dispatched == self.total, f"replica {a.index} idle while the driver holds requests"
            waiting = sum(len(r.chunk) for r in self.refs if r.start > self.now)
            assert waiting <= FEW, f"replica {a.index} idle while {waiting} requests wait on others"


class _Actor:
    def __init__(self, sim: _Sim, index: int, s_per_token: float):
        self.sim, self.index, self.rate, self.free_at, self.served = sim, index, s_per_token, 0.0, 0
        self.serve = self

    def remote(self, chunk):
        sim = self.sim
        start = max(self.free_at, sim.now)
        self.free_at = start + self.rate * sum(r.params.max_tokens for r in chunk)
        sim.dispatched += len(chunk)
        self.served += len(chunk)
        ref = _Ref(self, chunk, start, self.free_at)
        sim.refs.append(ref)
        return ref


@pytest.mark.parametrize("router", ["least_loaded", "round_robin"])
@pytest.mark.parametrize("rates", [(1.0, 1.0), (1.0, 3.0), (1.0, 1.5, 4.0), (1.0, 1.0, 1.0, 1.0)])
@pytest.mark.parametrize("chunk_max", [8, 32])
def test_no_replica_idles_while_another_has_a_queue(router, rates, chunk_max):
    """Seconds per token differ by replica (a slower GPU, a busier node): the router learns each one's speed from
    the chunks it serves and sizes and places chunks by it."""
    cfg = compose(["runtime=ray", f"runtime.replicas={len(rates)}", f"runtime.router={router}"])
    for seed in range(4):
        rng = random.Random(seed)
        reqs = [Request(i, [1] * rng.randint(1, 20), SamplingParams(max_tokens=rng.randint(4, 64)))
                for i in range(rng.randint(20, 120))]
        _route_and_check(cfg, rates, chunk_max, reqs)


def _route_and_check(cfg, rates, chunk_max, reqs):
    sim = _Sim(len(reqs))
    sim.actors = [_Actor(sim, i, r) for i, r in enumerate(rates)]
    RayExecutor(cfg)._route(sim, [_Slot(a, a.index) for a in sim.actors], reqs, chunk_max, None, None)
    assert all(r.finish_reason == "length" for r in reqs) and sim.dispatched == len(reqs)
    assert sim.idle_checks > 0  # the ends of the run were checked, where imbalance shows
    assert all(a.served > 0 for a in sim.actors)
    fast, slow = sim.actors[0], sim.actors[-1]
    if slow.rate > fast.rate:  # the faster replica takes more of the work
        assert fast.served > slow.served


class _Cluster:
    """A Ray cluster as RayExecutor._plan reads it; anything past planning (placement groups, actors) is absent,
    so a refusal that came later would be an AttributeError, not the ConfigError."""

    def __init__(self, resources):
        self._resources = resources

    def cluster_resources(self):
        return self._resources


def test_a_local_instance_is_planned_before_ray_starts(monkeypatch):
    """runtime.replicas=null on a machine without a GPU: refused before a local Ray instance starts (and logs)."""
    import synodic.distributed.cluster as cluster

    @contextmanager
    def no_session(*a, **k):
        raise AssertionError("Ray started before the plan was refused")
        yield
    monkeypatch.setattr(cluster, "ray_session", no_session)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    with pytest.raises(ConfigError) as e:
        RayExecutor(compose(["runtime=ray", "runtime.replicas=null"])).serve(
            [Request(0, [1, 2], SamplingParams(max_tokens=2))], max_seq_len=16)
    assert e.value.lines[0].startswith("runtime.replicas=null")


@pytest.mark.parametrize("over,resources,needle", [
    (["runtime.replicas=3"], {"CPU": 16.0, "GPU": 2.0}, "runtime.replicas=3: the Ray cluster has 2 GPU(s)"),
    (["runtime.replicas=null"], {"CPU": 16.0}, "runtime.replicas=null"),
    (["runtime.replicas=2", "runtime.device=cuda"], {"CPU": 16.0}, "runtime.device='cuda'"),
])
def test_more_replicas_than_gpus_is_refused_before_placement(monkeypatch, over, resources, needle):
    import synodic.distributed.cluster as cluster

    @contextmanager
    def fake_session(address, key, num_cpus=None, num_gpus=None):
        yield _Cluster(resources)
    monkeypatch.setattr(cluster, "ray_session", fake_session)
    ex = RayExecutor(compose(["runtime=ray", *over]))
    with pytest.raises(ConfigError) as e:
        ex.serve([Request(0, [1, 2], SamplingParams(max_tokens=2))], max_seq_len=16)
    assert needle in e.value.lines[0] and len(e.value.lines) == 1
    with pytest.raises(ConfigError), ex.workers():  # pipeline=bench's replicas: the same checks
        pass
