"""CPU measurement of host-fetch fractions: kv=hisparse vs kv=adaptive (and resident top-k) at several
device-pool sizes, on a model-free synthetic workload.

    python -m benchmarks.kv_measure            # prints a markdown table; --json for the raw numbers

The engine's scheduler admits, grows and preempts requests against each policy's own `blocks`; every
request prefills a random prompt and decodes `steps` tokens through the policy's real decode path
(newest-row placement, write-through, fused resolve, sparse attention). Only the indexer scores are
synthetic, a deterministic function of (request, layer, position, step) — identical for every policy —
shaped like long-context attention: a few sink tokens, a recent window, heavy-tailed per-position
importance, and per-step noise that makes the tail of the top-k churn.
"""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import torch

from benchmarks._cli import positive_floats, positive_int
from synodic.engine.request import Request, SamplingParams, Status
from synodic.engine.scheduler import Scheduler
from synodic.kv.config import AdaptiveKV, HiSparseKV, ResidentKV


class _Model:
    def __init__(self, layers: int, nq: int, nkv: int, hd: int):
        self.attention_layers = [SimpleNamespace(nq=nq, nkv=nkv, hd=hd) for _ in range(layers)]
        self._p = torch.zeros(1)

    def parameters(self):
        yield self._p


def synthetic_scores(rid: int, layer: int, P: int, T: int, noise: float, window: int, sinks: int) -> torch.Tensor:
    base = torch.Generator().manual_seed(1_000_003 * rid + 7919 * layer)
    imp = torch.randn(T, generator=base) * 1.5              # heavy-tailed importance, fixed per position
    step = torch.Generator().manual_seed(1_000_003 * rid + 7919 * layer + 104_729 * (P + 1))
    s = imp + noise * torch.randn(T, generator=step)
    t = torch.arange(T)
    s = s + 4.0 * ((t > P - window) & (t <= P)) + 6.0 * (t < sinks)
    return s


def run(kind: str, num_blocks: int, *, requests=8, prompt_len=1536, steps=64, layers=2, top_k=64,
        hot_buffer=None, block_size=16, noise=0.6, window=16, sinks=4, tail_pages=2) -> dict:
    max_len = prompt_len + steps + 1
    pages = -(-max_len // block_size) * requests
    common = dict(block_size=block_size, num_blocks=num_blocks, top_k=top_k)
    tiered = dict(common, host_num_blocks=pages + 8, index_num_blocks=pages + 8, hot_buffer=hot_buffer)
    cfg = {"resident": lambda: ResidentKV(**common),
           "hisparse": lambda: HiSparseKV(**tiered),
           "adaptive": lambda: AdaptiveKV(**tiered, tail_pages=tail_pages)}[kind]()
    nq, nkv, hd = 2, 1, 16
    pol = cfg.build(SimpleNamespace(model=_Model(layers, nq, nkv, hd), device=torch.device("cpu"),
                                    max_slots=requests, max_seq_len=max_len))
    slot_req: dict[int, int] = {}

    def scores(i, q, pg):
        T = pg.shape[1] * block_size
        return torch.stack([synthetic_scores(slot_req.get(int(r), -1), i, int(p), T, noise, window, sinks)
                            for r, p in zip(pol.rows.tolist(), pol.positions.tolist())])
    pol.indexer.decode_scores = scores
    g = torch.Generator().manual_seed(0)
    sched = Scheduler(requests, pol.blocks, requests)
    reqs = [Request(i, [1] * prompt_len, SamplingParams(max_tokens=steps)) for i in range(requests)]
    for r in reqs:
        sched.add(r)
    running_sum = n_steps = 0
    while sched.has_work():
        for r in sched.admit():
            slot_req[r.slot] = r.id
            T = r.length
            for i in range(layers):
                k = torch.randn(T, nkv, hd, generator=g)
                pol.write_prefill(i, r.slot, 0, k, torch.randn(T, nkv, hd, generator=g))
            r.output_ids.append(0)
        sched.grow()
        batch = [r for r in sched.running if r.status is Status.RUNNING]
        if not batch:
            if not sched.running and sched.waiting:
                raise RuntimeError(f"{kind}: nothing admits with num_blocks={num_blocks}")
            continue
        rows = torch.tensor([r.slot for r in batch])
        pos = torch.tensor([r.length - 1 for r in batch])
        pol.bind(rows, pos, pol.view_blocks_for(max(r.length for r in batch)))
        for i in range(layers):
            B = len(batch)
            pol.attend(i, torch.randn(B, nq, hd, generator=g), torch.randn(B, nkv, hd, generator=g),
                       torch.randn(B, nkv, hd, generator=g))
        pol.bytes_for([r.length for r in batch])
        running_sum += len(batch)
        n_steps += 1
        for r in batch:
            r.output_ids.append(0)
            if len(r.output_ids) >= steps:
                sched.finish(r, "length")
    st = pol.stats
    out = {"kv": kind, "num_blocks": num_blocks, "full_residency_pages": pages,
           "selected_rows": st["selected_rows"], "host_fetched_rows": st["fetched_rows"],
           "fetch_fraction": st["fetched_rows"] / max(1, st["selected_rows"]),
           "max_running": st["max_running"], "mean_running": running_sum / max(1, n_steps),
           "preemptions": sum(r.preemptions for r in reqs),
           "finished": sum(r.finish_reason == "length" for r in reqs), "requests": requests}
    for k in ("demoted_pages", "promoted_pages", "install_rows_device", "install_rows_host"):
        if k in st:
            out[k] = st[k]
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--loads", type=positive_floats, default="1.25,0.6,0.35",
                    help="device pool / full-residency demand")
    # counts must be >= 1: --requests 0 would measure nothing and print an all-zero table
    ap.add_argument("--requests", type=positive_int, default=8)
    ap.add_argument("--prompt-len", type=positive_int, default=1536)
    ap.add_argument("--steps", type=positive_int, default=64)
    ap.add_argument("--top-k", type=positive_int, default=64)
    a = ap.parse_args(argv)
    full = -(-(a.prompt_len + a.steps + 1) // 16) * a.requests
    rows = []
    for load in a.loads:
        nb = max(1, int(full * load))
        for kind in ("resident", "hisparse", "adaptive"):
            try:
                rows.append({"load": load, **run(kind, nb, requests=a.requests, prompt_len=a.prompt_len,
                                                 steps=a.steps, top_k=a.top_k)})
            except RuntimeError as e:
                rows.append({"load": load, "kv": kind, "num_blocks": nb, "error": str(e)})
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| pool / demand | kv | pages | fetch fraction | fetched / selected | max / mean running | preempt "
              "| demoted | promoted |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['load']} | {r['kv']} | {r['num_blocks']} | — | {r['error']} | | | | |")
                continue
            print(f"| {r['load']} | {r['kv']} | {r['num_blocks']} | {100 * r['fetch_fraction']:.2f} % | "
                  f"{r['host_fetched_rows']} / {r['selected_rows']} | {r['max_running']} / {r['mean_running']:.1f} | "
                  f"{r['preemptions']} | {r.get('demoted_pages', '')} | {r.get('promoted_pages', '')} |")
    return rows


if __name__ == "__main__":
    main()
