"""Benchmark of the eager SSM decode kernels (Mamba-2 and Gated DeltaNet) on the GPU.

    python -m benchmarks.ssm_decode --out results.json [--sweep]

For each op and state dtype (fp32, bf16) at the docs/measuring.md shapes it first checks the Triton
kernel against the torch reference (small batch, padding row, scattered slots), then for batch
1, 32, 256 times it with `triton.testing.do_bench` (median, L2 flushed by do_bench, slot sets
rotated so the state touched per call exceeds the L2) and as a CUDA-graph replay (R launches on R
disjoint slot sets per graph, time / R). Bytes are counted from what the kernel reads and writes.
A device-to-device copy of the same bytes is timed in the same process as a ceiling. `--sweep`
also times a grid of tile sizes / warps (graph replay) at every batch. Prints a markdown table, writes JSON.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import os
import platform
import sys

import torch
from synodic.kernels.timing import COPY_GBPS_H200, copy_gbps, graph_us

from benchmarks._cli import out_file, positive_ints
from synodic.results.env import git_commit

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES  # state touched per timed call (or per graph replay) at least this

MAMBA = dict(H=128, P=64, N=128, G=8)
GDN = dict(HV=32, Hk=16, K=128, V=128)
TINY_MAMBA = dict(H=6, P=8, N=16, G=3)
TINY_GDN = dict(HV=4, Hk=2, K=16, V=8)
MODEL_DTYPE = torch.bfloat16
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SWEEP = [(4, 4), (8, 4), (16, 4), (32, 4), (32, 8), (64, 8)]  # (BLOCK_P or BLOCK_V, warps)


def _esize(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


# ----------------------------------------------------------------------------------------------
# problem builders: state + R input sets; bytes moved per call
# ----------------------------------------------------------------------------------------------
class Mamba2Problem:
    name = "mamba2_decode"

    def __init__(self, shape, sdtype, batch, rot, device, gen):
        H, P, N, G = shape["H"], shape["P"], shape["N"], shape["G"]
        self.shape, self.sdtype, self.batch = shape, sdtype, batch
        num_slots = batch * rot
        self.state = (torch.randn(num_slots, H, P, N, device=device, generator=gen) * 0.1).to(sdtype)
        self.A = -torch.rand(H, device=device, generator=gen) * 2 - 0.1
        self.D = torch.randn(H, device=device, generator=gen)
        self.dt_bias = torch.randn(H, device=device, generator=gen) * 0.5
        perm = torch.randperm(num_slots, device=device, generator=gen).to(torch.int32)
        self.sets = []
        for r in range(rot):
            self.sets.append(dict(
                x=torch.randn(batch, H, P, device=device, generator=gen).to(MODEL_DTYPE),
                dt=torch.randn(batch, H, device=device, generator=gen) * 0.7 - 1.0,
                B=torch.randn(batch, G, N, device=device, generator=gen).to(MODEL_DTYPE),
                C=torch.randn(batch, G, N, device=device, generator=gen).to(MODEL_DTYPE),
                slot_ids=perm[r * batch:(r + 1) * batch].contiguous(),
            ))

    def args(self, r):
        s = self.sets[r]
        return (self.state, s["x"], s["dt"], self.A, s["B"], s["C"], self.D, self.dt_bias, s["slot_ids"])

    def call(self, r, backend="triton", **cfg):
        if cfg:
            from synodic.kernels.mamba2_decode.triton_impl import mamba2_decode_triton
            return mamba2_decode_triton(*self.args(r), **cfg)
        from synodic.kernels.mamba2_decode import mamba2_decode
        return mamba2_decode(*self.args(r), backend=backend)

    @staticmethod
    def state_bytes_per_slot(shape, sdtype):
        return shape["H"] * shape["P"] * shape["N"] * _esize(sdtype)

    def default_config(self):
        from synodic.kernels.mamba2_decode.triton_impl import default_config
        return default_config(self.sdtype, self.shape["P"], self.shape["N"], self.batch * self.shape["H"])

    @staticmethod
    def config_kwargs(block, num_warps):
        return dict(block_p=block, num_warps=num_warps)

    def bytes_moved(self):
        b, (H, P, N, G) = self.batch, (self.shape[k] for k in "HPNG")
        e, es = _esize(MODEL_DTYPE), _esize(self.sdtype)
        state = 2 * b * H * P * N * es
        inputs = b * H * P * e + b * H * 4 + 3 * H * 4 + 2 * b * G * N * e + b * 4
        return state, inputs + b * H * P * e  # + y


class GDNProblem:
    name = "gdn_decode"

    def __init__(self, shape, sdtype, batch, rot, device, gen):
        HV, Hk, K, V = shape["HV"], shape["Hk"], shape["K"], shape["V"]
        self.shape, self.sdtype, self.batch = shape, sdtype, batch
        num_slots = batch * rot
        self.state = (torch.randn(num_slots, HV, V, K, device=device, generator=gen) * 0.1).to(sdtype)
        perm = torch.randperm(num_slots, device=device, generator=gen).to(torch.int32)
        self.sets = []
        for r in range(rot):
            self.sets.append(dict(
                q=torch.randn(batch, Hk, K, device=device, generator=gen).to(MODEL_DTYPE),
                k=torch.randn(batch, Hk, K, device=device, generator=gen).to(MODEL_DTYPE),
                v=torch.randn(batch, HV, V, device=device, generator=gen).to(MODEL_DTYPE),
                g=torch.nn.functional.logsigmoid(torch.randn(batch, HV, device=device, generator=gen) + 2),
                beta=torch.sigmoid(torch.randn(batch, HV, device=device, generator=gen)),
                slot_ids=perm[r * batch:(r + 1) * batch].contiguous(),
            ))

    def args(self, r):
        s = self.sets[r]
        return (self.state, s["q"], s["k"], s["v"], s["g"], s["beta"], s["slot_ids"])

    def call(self, r, backend="triton", **cfg):
        if cfg:
            from synodic.kernels.gdn_decode.triton_impl import gdn_decode_triton
            return gdn_decode_triton(*self.args(r), **cfg)
        from synodic.kernels.gdn_decode import gdn_decode
        return gdn_decode(*self.args(r), backend=backend)

    @staticmethod
    def state_bytes_per_slot(shape, sdtype):
        return shape["HV"] * shape["V"] * shape["K"] * _esize(sdtype)

    def default_config(self):
        from synodic.kernels.gdn_decode.triton_impl import default_config
        return default_config(self.sdtype, self.shape["V"], self.shape["K"], self.batch * self.shape["HV"])

    @staticmethod
    def config_kwargs(block, num_warps):
        return dict(block_v=block, num_warps=num_warps)

    def bytes_moved(self):
        b, (HV, Hk, K, V) = self.batch, (self.shape[k] for k in ("HV", "Hk", "K", "V"))
        e, es = _esize(MODEL_DTYPE), _esize(self.sdtype)
        state = 2 * b * HV * V * K * es
        inputs = 2 * b * Hk * K * e + b * HV * V * e + 2 * b * HV * 4 + b * 4
        return state, inputs + b * HV * V * e  # + o


# ----------------------------------------------------------------------------------------------
def rel_rmse(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def check(cls, shape, sdtype, device):
    """Kernel vs reference at the real head shape, small batch, padding row, scattered slots, 2 steps."""
    gen = torch.Generator(device=device).manual_seed(0)
    p = cls(shape, sdtype, 6, 2, device, gen)  # 12 slots, batch 6
    ids = torch.tensor([7, 2, -1, 11, 0, 5], dtype=torch.int32, device=device)
    for s in p.sets:
        s["slot_ids"] = ids
    s_ref = p.state.clone()
    state0 = p.state.clone()
    worst_y, worst_s = 0.0, 0.0
    for r in range(2):
        y = p.call(r, "triton")
        st = p.state
        p.state = s_ref
        y_ref = p.call(r, "ref")
        p.state = st
        assert torch.isfinite(y).all() and (y[2] == 0).all()
        worst_y = max(worst_y, rel_rmse(y, y_ref))
        worst_s = max(worst_s, rel_rmse(p.state, s_ref))
    untouched = all(torch.equal(p.state[i], state0[i]) for i in (1, 3, 4, 6, 8, 9, 10))
    tol_out = max(TOL[sdtype], 4e-3 if MODEL_DTYPE == torch.bfloat16 else 0.0)  # ~1 ulp flips of bf16 y
    ok = worst_y < tol_out and worst_s < TOL[sdtype] and untouched
    return dict(kernel=cls.name, state_dtype=str(sdtype).replace("torch.", ""), rel_rmse_out=worst_y,
                rel_rmse_state=worst_s, untouched_slots_ok=untouched, ok=ok)


def time_graph(p, rot, **cfg):
    """Per-call time of one call per slot set (rot of them) in one CUDA graph."""
    return graph_us([functools.partial(p.call, r, **cfg) for r in range(rot)])


def time_plain(p, rot, **cfg):
    import triton.testing

    it = [0]

    def fn():
        p.call(it[0] % rot, **cfg)
        it[0] += 1

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # µs


def write_json(res: dict, path, quiet: bool = False) -> None:
    """Print the result's markdown table, write the result to path as JSON and say so (quiet: only write)."""
    if not quiet:
        print(res["table_md"])
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    if not quiet:
        print(f"\nwrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default="bench_ssm_decode.json")
    ap.add_argument("--batches", type=positive_ints, default="1,32,256")
    ap.add_argument("--sweep", action="store_true",
                    help="also time a grid of tile/warp configs (graph replay)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (smoke test, also on CPU: checks only)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda and not args.tiny:
        sys.exit("bench_ssm_decode: needs a CUDA GPU (use --tiny for a CPU smoke test of the checks)")
    batches = args.batches
    problems = [(Mamba2Problem, TINY_MAMBA if args.tiny else MAMBA),
                (GDNProblem, TINY_GDN if args.tiny else GDN)]
    sdtypes = [torch.float32, torch.bfloat16]
    import triton

    res = dict(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable), "-m", "benchmarks.ssm_decode"]
                         + (argv if argv is not None else sys.argv[1:])),
        device=torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        git_commit=git_commit(), hbm_gbps_reference=COPY_GBPS_H200, model_dtype=str(MODEL_DTYPE),
        shapes=dict(mamba2_decode=problems[0][1], gdn_decode=problems[1][1]),
        checks=[], rows=[], copy=[], sweep=[],
    )
    for cls, shape in problems:
        for sd in sdtypes:
            c = check(cls, shape, sd, device)
            res["checks"].append(c)
            print(f"check {c['kernel']:14s} state {c['state_dtype']:8s} rel_rmse out {c['rel_rmse_out']:.2e} "
                  f"state {c['rel_rmse_state']:.2e} untouched {c['untouched_slots_ok']} -> "
                  f"{'OK' if c['ok'] else 'FAIL'}", flush=True)
    if not cuda:
        _write(res, args.out)
        return 0 if all(c["ok"] for c in res["checks"]) else 1

    gen = torch.Generator(device=device).manual_seed(1)
    for cls, shape in problems:
        for sd in sdtypes:
            per_slot = cls.state_bytes_per_slot(shape, sd)
            for batch in batches:
                rot = max(1, math.ceil(ROTATE_BYTES / (batch * per_slot)))
                p = cls(shape, sd, batch, rot, device, gen)
                state_b, other_b = p.bytes_moved()
                us = time_plain(p, rot)
                us_g = time_graph(p, rot)
                total = state_b + other_b
                blk, nw = p.default_config()
                row = dict(kernel=cls.name, state_dtype=str(sd).replace("torch.", ""), batch=batch,
                           block=blk, num_warps=nw, us=us, us_graph=us_g, bytes=total, state_bytes=state_b,
                           rotate=rot,
                           gbps=total / (us * 1e3), gbps_graph=total / (us_g * 1e3))
                row["pct_hbm"] = 100 * row["gbps"] / COPY_GBPS_H200
                row["pct_hbm_graph"] = 100 * row["gbps_graph"] / COPY_GBPS_H200
                res["rows"].append(row)
                print(f"{cls.name} {row['state_dtype']} b={batch}: {us:.1f} µs, graph {us_g:.1f} µs, "
                      f"{row['gbps']:.0f} GB/s ({row['pct_hbm']:.1f} %)", flush=True)
                if args.sweep:
                    for blk, nw in SWEEP:
                        t = time_graph(p, rot, **p.config_kwargs(blk, nw))
                        res["sweep"].append(dict(kernel=cls.name, state_dtype=row["state_dtype"], batch=batch,
                                                 block=blk, num_warps=nw, us=t,
                                                 pct_hbm=100 * total / (t * 1e3) / COPY_GBPS_H200))
                        print(f"  sweep block {blk:3d} warps {nw}: {t:.1f} µs "
                              f"({res['sweep'][-1]['pct_hbm']:.1f} %)", flush=True)
                del p
                torch.cuda.empty_cache()
    for nbytes in sorted({r["state_bytes"] for r in res["rows"] if r["batch"] == max(batches)}):
        gbps = copy_gbps(nbytes, device)
        res["copy"].append(dict(bytes=nbytes, us=nbytes / (gbps * 1e3), gbps=gbps))
    _write(res, args.out)
    return 0 if all(c["ok"] for c in res["checks"]) else 1


def _write(res, path):
    lines = ["| kernel | state | batch | block, warps | µs | µs CUDA graph | bytes moved | GB/s "
             "| % of copy rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        best = min(r["us"], r["us_graph"])
        lines.append(f"| {r['kernel']} | {r['state_dtype']} | {r['batch']} | {r['block']}, {r['num_warps']} "
                     f"| {r['us']:.1f} | {r['us_graph']:.1f} "
                     f"| {r['bytes'] / 2**20:.2f} MiB | {r['bytes'] / (best * 1e3):.0f} | "
                     f"{100 * r['bytes'] / (best * 1e3) / COPY_GBPS_H200:.1f} |")
    for c in res["copy"]:
        lines.append(f"| copy_ (same state bytes, R+W) | - | 256 | - | {c['us']:.1f} | - "
                     f"| {c['bytes'] / 2**20:.2f} MiB "
                     f"| {c['gbps']:.0f} | {100 * c['gbps'] / COPY_GBPS_H200:.1f} |")
    res["table_md"] = "\n".join(lines)
    if res["sweep"]:
        print("\n| kernel | state | batch | block | warps | µs (graph) | % of copy rate |")
        print("|---|---|---|---|---|---|---|")
        for s in res["sweep"]:
            print(f"| {s['kernel']} | {s['state_dtype']} | {s['batch']} | {s['block']} | {s['num_warps']} "
                  f"| {s['us']:.1f} | {s['pct_hbm']:.1f} |")
    print("\n(GB/s and % use the faster of the two times)")
    write_json(res, path)


if __name__ == "__main__":
    sys.exit(main())
