"""Benchmark of the packed-weight decode linear (MXFP4 / NVFP4 / MXFP8 E4M3) against bf16 F.linear, and of
DualQuant's solve time for a whole 8B model, one process.

    python -m synodic.kernels.bench_quant --out quant.json [--budget 110] [--no-sweep]

1. GEMV / skinny GEMM, M in {1, 32}, weights (N, K) in {4096x4096, 4096x14336, 14336x4096}, bf16
   activations, the DualQuant deployment path (x * s fused in-kernel, weight-only: W4A16; W8A16 for
   mxfp8_e4m3, whose sweep also tries the hardware fp8 conversion, FP8_CVT=True). Each time is
   per call inside a CUDA graph of many calls that cycle over enough weight copies (> 4x L2) that every
   call reads its weight from HBM. Bytes = weight (codes + scales + s) + x + y. The kernel is first
   checked against the torch reference at each shape. Launch config: the run-time heuristic
   (`heuristic`), then, if the budget allows, a small sweep (`best`, with its config).
2. DualQuant (MXFP4, 15 iterations) over every linear of the blocks of nemotron_h_8b, random bf16
   weights built on the GPU; wall time, per projection kind, mean relative weight MSE.
Prints markdown tables last and writes JSON (rewritten after each part, so a cut-short run keeps
what it measured).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import time

import torch

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]  # (N, K) = (out, in)
MS = [1, 32]
FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3"]
SWEEP = {  # alternatives to the run-time heuristic (triton_impl.default_config)
    "gemv": [dict(BLOCK_N=16, BLOCK_K=512, SPLIT_K=4, num_warps=4, num_stages=2),
             dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=4, num_warps=4, num_stages=2),
             dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=8, num_warps=4, num_stages=2),
             dict(BLOCK_N=16, BLOCK_K=256, SPLIT_K=2, num_warps=4, num_stages=2),
             dict(BLOCK_N=16, BLOCK_K=1024, SPLIT_K=2, num_warps=8, num_stages=2)],
    "dot": [dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=3),
            dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=4, num_warps=4, num_stages=2),
            dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=8, num_stages=3),
            dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=8, num_warps=4, num_stages=2)],
}


def _graph_time_us(fns, calls: int) -> float:
    """Per-call time of `calls` calls cycling over fns, captured in one CUDA graph (eager fallback)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fns[i % len(fns)]()
        run = g.replay
    except Exception:  # noqa: BLE001 - measure eagerly instead
        def run():
            for i in range(calls):
                fns[i % len(fns)]()
    run()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 5
    e0.record()
    for _ in range(reps):
        run()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (reps * calls)


def _copies(nbytes: int) -> int:
    return max(2, math.ceil(ROTATE_BYTES / nbytes))


class Case:
    """One (N, K, M): bf16 weights + quantized copies, activations, s."""

    def __init__(self, N, K, M, gen):
        self.N, self.K, self.M = N, K, M
        self.w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        self.x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        self.s = torch.rand(K, device="cuda", generator=gen) + 0.5
        self.io_bytes = (M * K + M * N) * 2

    def bf16(self) -> dict:
        import torch.nn.functional as F
        ws = [self.w.clone() for _ in range(_copies(self.w.numel() * 2))]
        fns = [lambda w=w: F.linear(self.x, w) for w in ws]
        us = _graph_time_us(fns, calls=max(len(fns), 24))
        del ws
        b = self.N * self.K * 2 + self.io_bytes
        return {"us": us, "weight_bytes": self.N * self.K * 2, "GB_per_s": b / us / 1e3}

    def quant(self, fmt: str, config: dict | None) -> dict:
        from synodic.kernels.quant_linear import quant_linear

        from synodic.quant import quantize
        q = quantize(self.w.float() / self.s, fmt)
        wb = q.nbytes() + self.K * 4
        qs = []
        for _ in range(_copies(wb)):
            qc = type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                         None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
            qs.append(qc)
        fns = [lambda qc=qc: quant_linear(self.x, qc, self.s, backend="triton", config=config) for qc in qs]
        us = _graph_time_us(fns, calls=max(len(fns), 24))
        del qs
        return {"us": us, "weight_bytes": wb, "GB_per_s": (wb + self.io_bytes) / us / 1e3}

    def check(self, fmt: str) -> float:
        from synodic.kernels.quant_linear import quant_linear

        from synodic.quant import quantize
        q = quantize(self.w.float() / self.s, fmt)
        y = quant_linear(self.x, q, self.s, backend="triton").double()
        r = quant_linear(self.x, q, self.s, backend="ref").double()
        return ((y - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()


def bench_gemv(log) -> list[dict]:
    from synodic.kernels.quant_linear.triton_impl import default_config
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, K in SHAPES:
        for M in MS:
            c = Case(N, K, M, gen)
            base = c.bf16()
            for fmt in FORMATS:
                err = c.check(fmt)
                heur = default_config(M, N, K, fmt, torch.cuda.get_device_properties(0).multi_processor_count)
                r = c.quant(fmt, None)
                row = {"N": N, "K": K, "M": M, "format": fmt, "rel_rmse_vs_ref": err,
                       "bf16_us": base["us"], "bf16_GB_per_s": base["GB_per_s"],
                       "bf16_weight_bytes": base["weight_bytes"],
                       "weight_bytes": r["weight_bytes"], "us": r["us"], "GB_per_s": r["GB_per_s"],
                       "speedup": base["us"] / r["us"], "config": heur, "best_us": r["us"], "best_config": heur}
                rows.append(row)
                log(f"{N}x{K} M={M} {fmt}: {r['us']:.1f} us ({r['GB_per_s']:.0f} GB/s) vs bf16 {base['us']:.1f} us "
                    f"({base['GB_per_s']:.0f} GB/s) -> {row['speedup']:.2f}x  err {err:.1e}")
            del c
            torch.cuda.empty_cache()
    return rows


def sweep(rows: list[dict], deadline: float, log) -> None:
    """Time the SWEEP configs per row until the deadline; keep the fastest (the heuristic included)."""
    from synodic.kernels.quant_linear.triton_impl import block_m_for
    gen = torch.Generator(device="cuda").manual_seed(1)
    for row in rows:
        if time.monotonic() > deadline:
            log("sweep stopped: time budget")
            break
        c = Case(row["N"], row["K"], row["M"], gen)
        cfgs = SWEEP["gemv" if block_m_for(row["M"]) == 1 else "dot"]
        if row["format"].startswith("mxfp8"):  # decode by hardware conversion instead of bit arithmetic
            cfgs = [dict(row["config"], FP8_CVT=True)] + cfgs
        for cfg in cfgs:
            if time.monotonic() > deadline:
                break
            try:
                us = c.quant(row["format"], cfg)["us"]
            except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                log(f"config {cfg} failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            if us < row["best_us"]:
                row["best_us"], row["best_config"] = us, cfg
        row["best_speedup"] = row["bf16_us"] / row["best_us"]
        row["best_GB_per_s"] = (row["weight_bytes"] + c.io_bytes) / row["best_us"] / 1e3
        del c
        torch.cuda.empty_cache()


def bench_dualquant(log, iters: int = 15, fmt: str = "mxfp4") -> dict:
    from synodic.models.presets import PRESETS
    from synodic.models.weights import random_model
    from synodic.quant.apply import select_linears
    from synodic.quant.methods import solve_full
    t0 = time.perf_counter()
    model = random_model(PRESETS["nemotron_h_8b"], 0, "cuda", torch.bfloat16)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    names, _ = select_linears(model, ["blocks.*"], fmt)
    mods = dict(model.named_modules())
    kinds: dict[str, dict] = {}
    errs, params = [], 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    solve_s = 0.0
    for n in names:
        w = mods[n].weight
        t1 = time.perf_counter()
        sol = solve_full(w, fmt, "dualquant", iters=iters)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t1
        solve_s += dt
        wf = w.float()
        errs.append(((wf - sol.effective_weight()).pow(2).sum() / wf.pow(2).sum()).item())  # syncs
        k = n.rsplit(".", 1)[-1]
        d = kinds.setdefault(k, {"layers": 0, "params": 0, "s": 0.0, "shape": list(w.shape)})
        d["layers"] += 1
        d["params"] += w.numel()
        d["s"] += dt
        params += w.numel()
        del sol, wf
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out = {"model": "nemotron_h_8b", "format": fmt, "iters": iters, "linears": len(names), "params": params,
           "wall_s": wall, "solve_s": solve_s, "model_build_s": build_s, "target_s": 30.0,
           "rel_mse_mean": sum(errs) / len(errs),
           "per_kind": kinds, "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30}
    log(f"DualQuant {fmt} x{iters}: {len(names)} linears, {params / 1e9:.2f}B params in {wall:.1f}s "
        f"(solves {solve_s:.1f}s) "
        f"(mean rel MSE {out['rel_mse_mean']:.3e})")
    del model
    torch.cuda.empty_cache()
    return out


def _table(rows) -> str:
    cols = ["N x K", "M", "format", "bf16 us", "bf16 GB/s", "q bytes (MB)", "q us", "q GB/s", "speedup",
            "best us", "best speedup", "err"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join([
            f"{r['N']}x{r['K']}", str(r["M"]), r["format"], f"{r['bf16_us']:.1f}", f"{r['bf16_GB_per_s']:.0f}",
            f"{r['weight_bytes'] / 1e6:.2f}", f"{r['us']:.1f}", f"{r['GB_per_s']:.0f}", f"{r['speedup']:.2f}x",
            f"{r['best_us']:.1f}", f"{r.get('best_speedup', r['speedup']):.2f}x",
            f"{r['rel_rmse_vs_ref']:.1e}"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="quant.json")
    ap.add_argument("--budget", type=float, default=110.0, help="seconds; the launch-config sweep stops after")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--skip-dualquant", action="store_true")
    a = ap.parse_args(argv)
    start = time.monotonic()
    if not torch.cuda.is_available():
        raise SystemExit("bench_quant needs a CUDA GPU")
    import triton
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "mode": "W4A16 (mxfp4, nvfp4) / W8A16 (mxfp8_e4m3) weight-only, DualQuant layout (x * s fused), "
                   "bf16 activations",
           "notes": ["times per call inside a CUDA graph; weights rotated over > 4x L2 so each call reads HBM",
                     "Hopper has no FP4 tensor cores: W4A4 would be emulated (fake-quantized activations), "
                     "so only weight-only decode speed is measured"]}
    log = lambda m: print(m, flush=True)  # noqa: E731

    def save():
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)

    doc["gemv"] = bench_gemv(log)
    save()
    if not a.skip_dualquant:
        try:
            doc["dualquant"] = bench_dualquant(log)
        except Exception as e:  # noqa: BLE001 - keep the GEMV table
            doc["dualquant"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"DualQuant failed: {doc['dualquant']['error']}")
        save()
    if not a.no_sweep and time.monotonic() < start + a.budget:
        sweep(doc["gemv"], start + a.budget, log)
        save()
    doc["elapsed_s"] = time.monotonic() - start
    save()
    print()
    print(_table(doc["gemv"]))
    dq = doc.get("dualquant", {})
    if "wall_s" in dq:
        print(f"\nDualQuant MXFP4 x{dq['iters']} over {dq['linears']} linears of nemotron_h_8b "
              f"({dq['params'] / 1e9:.2f}B params): {dq['wall_s']:.1f} s (target < 30 s), "
              f"mean rel. MSE {dq['rel_mse_mean']:.3e}, peak {dq['peak_mem_GiB']:.1f} GiB")
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
