"""Benchmark of the ReplaySSM per-head decode kernels split by step kind: a plain step (cursor 5: output-only route)
vs the flush step (cursor L-1 = 15: the ring folded into the fp32 checkpoint, checkpoint and copy written),
per tile / flush fold, fp32 and dual_bf16 checkpoints, Mamba-2 and GDN, against the eager kernels.

    python -m benchmarks.replay_flush --out replay_flush.json [--batch 256] [--kinds mamba2,gdn]

Shapes: Mamba-2 H=128 P=64 N=128 G=8, GDN HV=32 Hk=16 K=V=128, L = 16; states far past the L2.
`triton.testing.do_bench` medians (L2 flushed between reps). The average over an L-step cycle is
(15 plain + 1 flush) / 16: what `bench_replay` times in one go. Without a GPU: a tiny smoke under
TRITON_INTERPRET (plumbing only, times meaningless).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from synodic.kernels.gdn_decode import gdn_decode  # noqa: E402
from synodic.kernels.gdn_replay import gdn_replay_alloc  # noqa: E402
from synodic.kernels.gdn_replay.decode import launch_decode as launch_gdn  # noqa: E402
from synodic.kernels.mamba2_decode import mamba2_decode  # noqa: E402
from synodic.kernels.mamba2_replay import mamba2_replay_alloc  # noqa: E402
from synodic.kernels.mamba2_replay.decode import launch_decode as launch_m2  # noqa: E402

from benchmarks._cli import out_file, positive_int

L = 16
# (config, split, flush config, cursor first): split = an output-only launch (config) + a flush launch (flush
# config (BLOCK, warps, fold, tiles per program); None = the launcher's default); cursor first (Mamba-2):
# the output-only launch reads the cursor before its tile (True: write_pos[slot]; "row": a per-row copy gathered
# in the step; "row_pre": gathered before the step, as the engine's one gather per step serves every layer)
CONFIGS = {"mamba2": [((64, 2, "serial"), False, None, False), ((64, 2, "tf32x3"), False, None, False),
                      ((64, 2, "tf32x3"), True, None, False), ((64, 2, "tf32x3"), True, None, True),
                      ((32, 2, "tf32x3"), True, (64, 4, "tf32x3", 16), False),
                      ((64, 4, "tf32x3"), True, (64, 4, "tf32x3", 16), False),
                      ((32, 1, "tf32x3"), True, (64, 4, "tf32x3", 16), False),
                      ((16, 1, "tf32x3"), True, (64, 4, "tf32x3", 16), False)],
           "gdn": [((32, 1, "serial"), False, None, False), ((32, 1, "dot"), False, None, False),
                   ((32, 1, "serial"), True, (32, 1, "dot", 8), False),
                   ((32, 1, "serial"), True, (32, 2, "dot", 8), False),
                   ((32, 1, "serial"), True, (32, 2, "serial", 8), False),
                   ((32, 1, "serial"), True, (64, 4, "tf32x3", 8), False),
                   ((32, 1, "serial"), True, (32, 1, "dot", 32), False),
                   ((32, 1, "dot"), True, None, False), ((16, 1, "dot"), True, (32, 1, "dot", 16), False),
                   ((32, 2, "dot"), True, (32, 1, "dot", 16), False), ((64, 2, "dot"), True, (32, 1, "dot", 16), False),
                   ((64, 4, "dot"), True, (32, 1, "dot", 16), False)]}

# --flush-sweep (Mamba-2, split, default output-only launch): flush launch configs (BLOCK, warps, fold, tiles per
# program), each with the cursor read as before and with the per-row cursor gathered before the step (row_pre)
FLUSH_SWEEP = [(64, 4, "tf32x3", 16), (64, 4, "bf16x3", 16), (32, 4, "bf16x3", 16), (64, 4, "bf16x3", 8)]


def timer(device):
    if device == "cuda":
        import triton.testing
        return lambda f: triton.testing.do_bench(f, warmup=10, rep=60) * 1e3

    def once(f):
        t = time.perf_counter()
        f()
        return (time.perf_counter() - t) * 1e6
    return once


def run(kind, b, device, shapes, configs, modes=("fp32", "dual_bf16")):
    g = torch.Generator(device=device).manual_seed(0)
    bench = timer(device)
    rn = lambda *s: torch.randn(*s, device=device, generator=g)  # noqa: E731
    sid = torch.arange(b, dtype=torch.int32, device=device)
    res = {}
    if kind == "mamba2":
        H, P, N, G = shapes
        x, z, B, C = rn(b, H, P).bfloat16(), rn(b, H, P).bfloat16(), rn(b, G, N).bfloat16(), rn(b, G, N).bfloat16()
        dt = rn(b, H)
        A, D, bias = -torch.rand(H, device=device), torch.rand(H, device=device), torch.rand(H, device=device)
        st = rn(b, H, P, N) * 0.1
        res["eager_us"] = bench(lambda: mamba2_decode(st, x, dt, A, B, C, D, bias, sid, z))
        del st
        alloc = lambda lo: mamba2_replay_alloc(b, H, P, N, G, L, lo_dtype=lo, device=device)  # noqa: E731
        sid_l = sid.long()
        row_pre = [None]

        def step(c, cfg):
            # cursor first "row": the per-row cursor gather (one per step in the engine, shared by every
            # layer) is timed inside each step here
            row_wp = c["write_pos"].index_select(0, sid_l) if cfg[3] == "row" else None
            if cfg[3] == "row_pre":  # gathered outside the step: the engine's one gather per step, all layers
                row_wp = row_pre[0]
            return launch_m2(**c, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, slot_ids=sid, z=z,
                             y=torch.empty_like(x), L=L, config=cfg[0], split=cfg[1], flush_config=cfg[2],
                             cursor_first=cfg[3] is True, row_wp=row_wp)
        rings = (("ring_x", 1.0), ("ring_B", 1.0))
    else:
        HV, Hk, K, V = shapes
        q, k, v = rn(b, Hk, K).bfloat16(), rn(b, Hk, K).bfloat16(), rn(b, HV, V).bfloat16()
        gg, beta = -torch.rand(b, HV, device=device, generator=g) * 0.1, torch.rand(b, HV, device=device, generator=g)
        st = rn(b, HV, V, K) * 0.1
        res["eager_us"] = bench(lambda: gdn_decode(st, q, k, v, gg, beta, sid))
        del st
        alloc = lambda lo: gdn_replay_alloc(b, HV, V, K, Hk, L, lo_dtype=lo, device=device)  # noqa: E731
        step = lambda c, cfg: launch_gdn(c["ckpt"], c["ring_u"], c["ring_k"], c["ring_g"], c["write_pos"],  # noqa: E731
                                         q, k, v, gg, beta, sid, torch.empty_like(v), L=L, scale=None,
                                         use_qk_l2norm=True, ckpt_lo=c.get("ckpt_lo"), config=cfg[0], split=cfg[1],
                                         flush_config=cfg[2])
        rings = (("ring_u", 0.1), ("ring_k", 0.1))
    for mode, lo in (("fp32", None), ("dual_bf16", torch.bfloat16)):
        if mode not in modes:
            continue
        c = alloc(lo)
        c["ckpt"].normal_(0, 0.1, generator=g)
        if lo is not None:
            c["ckpt_lo"].copy_(c["ckpt"])
        for name, sd in rings:
            c[name].normal_(0, sd, generator=g)
        dk = "ring_dt" if kind == "mamba2" else "ring_g"
        c[dk].uniform_(0, 0.1, generator=g) if kind == "mamba2" else c[dk].uniform_(-0.1, 0, generator=g)
        for cfg in configs:
            row = {}
            for wp in (5, L - 1):
                c["write_pos"].fill_(wp)
                if kind == "mamba2":
                    row_pre[0] = c["write_pos"].index_select(0, sid_l)
                row["plain_us" if wp == 5 else "flush_us"] = bench(lambda c=c, cfg=cfg: step(c, cfg))
            row["cycle_us"] = (15 * row["plain_us"] + row["flush_us"]) / 16
            row["speedup_cycle"] = res["eager_us"] / row["cycle_us"]
            res[f"{mode} {cfg}"] = row
            print(f"{kind} {mode} {cfg}: plain {row['plain_us']:.1f} µs, flush {row['flush_us']:.1f} µs, "
                  f"cycle {row['cycle_us']:.1f} µs = {row['speedup_cycle']:.2f}x eager {res['eager_us']:.1f} µs",
                  flush=True)
        c = None
        if device == "cuda":
            torch.cuda.empty_cache()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=None)
    ap.add_argument("--batch", type=positive_int, default=256)
    ap.add_argument("--kinds", default="mamba2,gdn")
    ap.add_argument("--modes", default="fp32,dual_bf16", help="checkpoint modes: fp32, dual_bf16")
    ap.add_argument("--flush-sweep", action="store_true",
                    help="Mamba-2 only: the split step with each FLUSH_SWEEP flush launch config")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = {"mamba2": (128, 64, 128, 8), "gdn": (32, 16, 128, 128)}
    configs = CONFIGS
    if a.flush_sweep:
        a.kinds = "mamba2"
        configs = {"mamba2": [((64, 2, "tf32x3"), True, f, cf) for f in FLUSH_SWEEP for cf in (False, "row_pre")]
                   + [((64, 2, "tf32x3"), True, FLUSH_SWEEP[1], "row"), ((64, 2, "bf16x3"), False, None, False)]}
    if device == "cpu":  # smoke: tiny shapes, tile configs that fit them
        a.batch, shapes = 2, {"mamba2": (2, 16, 16, 1), "gdn": (2, 1, 16, 16)}
        configs = {"mamba2": [((16, 1, "serial"), False, None, False),
                              ((16, 1, "serial"), True, (8, 1, "serial", 2), "row"),
                              ((16, 1, "serial"), True, (8, 1, "serial", 2), True)],
                   "gdn": [((16, 1, "dot"), False, None, False), ((16, 1, "dot"), True, (8, 1, "dot", 2), False)]}
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "batch": a.batch}
    for kind in a.kinds.split(","):
        out[kind] = run(kind, a.batch, device, shapes[kind], configs[kind], a.modes.split(","))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
