"""Where a long-context decode step goes: a per-kernel table of one uncaptured decode step under each top-k
KV policy, through the real engine (the profile behind BENCHMARKS.md's step breakdowns).

    python -m benchmarks.kv_profile_step --out prof/            # GPU: dsa_mla_7b, 4 x 16384-token prompts
    python -m benchmarks.kv_profile_step --smoke --out prof/    # CPU: tiny_dsa, seconds (automatic without CUDA)

Every request is offered at once; the tiered policies get a device pool of `--pool-fraction` of the requests'
pages (so adaptive demotes and both fetch from the host), resident gets room for all. Step `--profile-step` of
each policy's decode runs under torch.profiler (CUDA graphs off: a captured step shows as one launch); the
table, sorted by device time, goes to `<out>/profile_<policy>.txt`, and every decode step's wall time to
`<out>/steps.json`.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks._cli import positive_int

POLICIES = ("resident", "hisparse", "adaptive")


def profile(args) -> dict:
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.graph import build_graph
    from synodic.kv.config import AdaptiveKV, HiSparseKV, ResidentKV
    from synodic.kv.rebuild import rebuild_kv

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    P, N, K, bs = args.prompt_len, args.requests, args.top_k, args.block_size
    cfg = compose([f"model={args.model}", "model.weights=random", f"runtime.device={args.device}",
                   f"runtime.max_slots={N}", "kv=resident", f"kv.top_k={K}", "kv.num_blocks=1",
                   f"kv.block_size={bs}", "runtime.cuda_graphs=false"])
    graph = build_graph(cfg, P + args.output_len + bs, N)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (P,), generator=gen).tolist() for _ in range(N)]
    pages = N * (-(-(P + args.output_len) // bs) + 1)
    tiered = dict(block_size=bs, num_blocks=max(1, int(args.pool_fraction * pages)), host_num_blocks=pages + 8,
                  index_num_blocks=pages + 8, top_k=K)
    configs = {"resident": ResidentKV(block_size=bs, num_blocks=pages + 8, top_k=K),
               "hisparse": HiSparseKV(**tiered), "adaptive": AdaptiveKV(**tiered)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    steps = {}
    for name in args.policies:
        rebuild_kv(graph, configs[name])
        eng = Engine(graph, max_running=N)
        decode, times = eng.runner.decode, []

        def timed(*a, decode=decode, times=times, name=name, **k):
            sync()
            t0 = time.perf_counter()
            if len(times) == args.profile_step:
                with torch.profiler.profile(activities=acts) as prof:
                    r = decode(*a, **k)
                    sync()
                key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
                (out / f"profile_{name}.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=50))
            else:
                r = decode(*a, **k)
                sync()
            times.append(time.perf_counter() - t0)
            return r
        eng.runner.decode = timed
        eng.generate([Request(i, p, SamplingParams(max_tokens=args.output_len)) for i, p in enumerate(prompts)])
        steps[name] = [round(1e3 * t, 3) for t in times]
        print(f"{name}: {len(times)} decode steps, ms {steps[name]}", flush=True)
    (out / "steps.json").write_text(json.dumps({"args": vars(args), "step_ms": steps}, indent=1))
    return steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="profile_step")
    ap.add_argument("--smoke", action="store_true", help="tiny_dsa on the CPU (automatic without CUDA)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--prompt-len", type=positive_int)
    ap.add_argument("--requests", type=positive_int)
    ap.add_argument("--top-k", type=positive_int)
    ap.add_argument("--block-size", type=positive_int)
    ap.add_argument("--output-len", type=positive_int, default=12)
    ap.add_argument("--pool-fraction", type=float, default=0.75,
                    help="tiered policies' device pool as a fraction of the requests' pages")
    ap.add_argument("--profile-step", type=int, default=7, help="which decode step (0-based) is profiled")
    a = ap.parse_args(argv)
    smoke = a.smoke or not torch.cuda.is_available()
    defaults = (dict(model="tiny_dsa", device="cpu", prompt_len=256, requests=2, top_k=16, block_size=16) if smoke
                else dict(model="dsa_mla_7b", device="cuda", prompt_len=16384, requests=4, top_k=2048, block_size=64))
    for k, v in defaults.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.policies = [p for p in a.policies.split(",") if p]
    bad = [p for p in a.policies if p not in POLICIES]
    if bad:
        ap.error(f"argument --policies: unknown {bad}; expected some of {list(POLICIES)}")
    if not 0 <= a.profile_step < a.output_len - 1:
        ap.error(f"argument --profile-step: {a.profile_step}: expected 0 <= step < output-len - 1 = {a.output_len - 1}")
    if not 0 < a.pool_fraction <= 1:
        ap.error(f"argument --pool-fraction: {a.pool_fraction}: expected a number in (0, 1] (the tiered policies' "
                 "device pool as a share of the requests' pages)")
    return profile(a)


if __name__ == "__main__":
    main()
