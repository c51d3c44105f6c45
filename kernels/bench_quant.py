"""Benchmark of the packed-weight decode linear (MXFP4 / NVFP4 / MXFP8 E4M3) against bf16 F.linear, and of
DualQuant's solve time for a whole 8B model, one process.

    python -m synodic.kernels.bench_quant --out quant.json [--budget 110] [--no-sweep] [--skip-dualquant]
        [--shapes 4096x14336,14336x4096] [--ms 1,32] [--formats mxfp4,nvfp4,mxfp8_e4m3]
    TRITON_INTERPRET=1 python -m synodic.kernels.bench_quant --smoke     # CPU: every config vs the reference

1. GEMV / skinny GEMM, M in {1, 32}, weights (N, K) in {4096x4096, 4096x14336, 14336x4096}, bf16
   activations, the DualQuant deployment path (x * s fused in-kernel, weight-only: W4A16; W8A16 for
   mxfp8_e4m3, whose sweep also tries the hardware fp8 conversion, FP8_CVT=True). Each time is
   per call inside a CUDA graph of many calls that cycle over enough weight copies (> 4x L2) that every
   call reads its weight from HBM. Bytes = weight (codes + scales + s) + x + y. Side by side per row: the v1
   kernels under their heuristic (`v1_us`), the v2 kernels under the run-time heuristic (`us`), then, if
   the budget allows, the SWEEP candidates (`sweep`, `best_us` with its config). Every config is checked
   against the torch reference before it is timed (a config off by > 2e-2 rel. RMSE is not timed).
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
CHECK_TOL = 2e-2  # rel. RMSE vs the reference above which a config is reported broken and not timed
# Alternatives to the run-time heuristic (triton_impl.default_config), most promising first (the sweep
# goes candidate by candidate over all rows, so a cut-short run has the first ones everywhere). BLOCK_K is
# given for 4-bit formats (BLOCK_K/2 code bytes per row); 8-bit formats use half (same bytes per row).
# No SPLIT_K: chosen per shape for the tile (triton_impl.resolve_config).
SWEEP = {
    "m1": [dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=256, num_warps=8, num_stages=3),
           dict(KERNEL="gemv", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=2),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3, SEM=False),
           dict(KERNEL="dot", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4),
           dict(KERNEL="gemv", BLOCK_N=64, BLOCK_K=256, num_warps=8, num_stages=2),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=512, num_warps=4, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, TWO_MUL=True),
           dict(KERNEL="gemv", BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=2),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4)],
    "mN": [dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=256, num_warps=8, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3, SEM=False),
           dict(KERNEL="dot", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=512, num_warps=4, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, TWO_MUL=True),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, BLOCK_M=16)],
}


def candidates(M: int, fmt: str) -> list[dict]:
    """The sweep configs for a row (8-bit: half the BLOCK_K; MXFP8 also tries the hardware fp8 conversion)."""
    out = []
    if fmt.startswith("mxfp8"):
        out.append(dict(KERNEL="dot", FP8_CVT=True))
    for c in SWEEP["m1" if M == 1 else "mN"]:
        c = dict(c)
        if not fmt.startswith(("mxfp4", "nvfp4")):
            c["BLOCK_K"] = max(32, c["BLOCK_K"] // 2)
        out.append(c)
    return out


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
    """One (N, K, M): bf16 weights, their quantized copies per format (cached), activations, s."""

    def __init__(self, N, K, M, gen, device="cuda"):
        self.N, self.K, self.M, self.device = N, K, M, device
        self.w = (torch.randn(N, K, device=device, generator=gen) * 0.02).to(torch.bfloat16)
        self.x = torch.randn(M, K, device=device, generator=gen).to(torch.bfloat16)
        self.s = torch.rand(K, device=device, generator=gen) + 0.5
        self.io_bytes = (M * K + M * N) * 2
        self._q: dict = {}

    def bf16(self) -> dict:
        import torch.nn.functional as F
        ws = [self.w.clone() for _ in range(_copies(self.w.numel() * 2))]
        fns = [lambda w=w: F.linear(self.x, w) for w in ws]
        us = _graph_time_us(fns, calls=max(len(fns), 24))
        del ws
        b = self.N * self.K * 2 + self.io_bytes
        return {"us": us, "weight_bytes": self.N * self.K * 2, "GB_per_s": b / us / 1e3}

    def qs(self, fmt: str) -> list:
        """Enough copies of the quantized weight to rotate through > 4x L2 (the first is the checked one)."""
        if fmt not in self._q:
            from synodic.quant import quantize
            q = quantize(self.w.float() / self.s, fmt)
            n = _copies(self.wbytes(q)) if self.device == "cuda" else 1
            self._q[fmt] = [q] + [type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                                          None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
                                  for _ in range(n - 1)]
        return self._q[fmt]

    def wbytes(self, q) -> int:
        return q.nbytes() + self.K * 4

    def quant(self, fmt: str, config: dict | None) -> dict:
        from synodic.kernels.quant_linear import quant_linear
        qs = self.qs(fmt)
        fns = [lambda qc=qc: quant_linear(self.x, qc, self.s, backend="triton", config=config) for qc in qs]
        us = _graph_time_us(fns, calls=max(len(fns), 24))
        wb = self.wbytes(qs[0])
        return {"us": us, "weight_bytes": wb, "GB_per_s": (wb + self.io_bytes) / us / 1e3}

    def check(self, fmt: str, config: dict | None = None) -> float:
        """Relative RMSE of the kernel under `config` vs the torch reference (NaN output -> inf)."""
        from synodic.kernels.quant_linear import quant_linear
        q = self.qs(fmt)[0]
        r = quant_linear(self.x, q, self.s, backend="ref").double()
        e = 0.0
        for _ in range(3):  # repeated: a split-K reduction race would show up as a varying error
            y = quant_linear(self.x, q, self.s, backend="triton", config=config).double()
            e = max(e, ((y - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item())
        return e if math.isfinite(e) else float("inf")


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def bench_gemv(log, shapes, ms, formats, cases: dict) -> list[dict]:
    """bf16 vs v1 (old heuristic) vs v2 (new heuristic), side by side per row."""
    from synodic.kernels.quant_linear.triton_impl import resolve_config
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, K in shapes:
        for M in ms:
            c = cases[(N, K, M)] = Case(N, K, M, gen)
            base = c.bf16()
            for fmt in formats:
                row = {"N": N, "K": K, "M": M, "format": fmt, "bf16_us": base["us"],
                       "bf16_GB_per_s": base["GB_per_s"], "bf16_weight_bytes": base["weight_bytes"], "sweep": []}
                for tag, cfg in (("v1_", dict(KERNEL="v1")), ("", None)):
                    full = resolve_config(M, N, K, fmt, cfg, _sms())
                    err = c.check(fmt, cfg)
                    row[tag + "rel_rmse_vs_ref"], row[tag + "config"] = err, full
                    r = c.quant(fmt, cfg)
                    row.update({tag + "us": r["us"], tag + "GB_per_s": r["GB_per_s"],
                                tag + "speedup": base["us"] / r["us"], "weight_bytes": r["weight_bytes"]})
                    log(f"{N}x{K} M={M} {fmt} {tag or 'v2_'}heuristic: {r['us']:.1f} us ({r['GB_per_s']:.0f} GB/s) "
                        f"vs bf16 {base['us']:.1f} us ({base['GB_per_s']:.0f} GB/s) -> "
                        f"{row[tag + 'speedup']:.2f}x  err {err:.1e}{'  BROKEN' if err > CHECK_TOL else ''}")
                ok = row["rel_rmse_vs_ref"] <= CHECK_TOL
                row["best_us"] = row["us"] if ok else float("inf")
                row["best_config"] = row["config"] if ok else None
                row["best_speedup"] = base["us"] / row["best_us"]
                rows.append(row)
            torch.cuda.empty_cache()
    return rows


def sweep(rows: list[dict], cases: dict, deadline: float, log) -> None:
    """Time the candidates (checked first) until the deadline, candidate by candidate over all rows; keep
    each row's fastest correct config (the v2 heuristic included)."""
    from synodic.kernels.quant_linear.triton_impl import resolve_config
    n = max(len(candidates(r["M"], r["format"])) for r in rows)
    for i in range(n):
        for row in rows:
            cands = candidates(row["M"], row["format"])
            if i >= len(cands):
                continue
            if time.monotonic() > deadline:
                log(f"sweep stopped: time budget (at candidate {i})")
                return
            c = cases[(row["N"], row["K"], row["M"])]
            cfg = cands[i]
            full = resolve_config(row["M"], row["N"], row["K"], row["format"], cfg, _sms())
            ent = {"config": full}
            try:
                ent["err"] = c.check(row["format"], cfg)
                if ent["err"] <= CHECK_TOL:
                    ent["us"] = c.quant(row["format"], cfg)["us"]
            except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                ent["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                log(f"config {full} failed: {ent['error']}")
            row["sweep"].append(ent)
            if "us" in ent and ent["us"] < row["best_us"]:
                row["best_us"], row["best_config"] = ent["us"], full
            elif "err" in ent and ent["err"] > CHECK_TOL:
                log(f"{row['N']}x{row['K']} M={row['M']} {row['format']} config {full}: BROKEN err {ent['err']:.1e}")
            row["best_speedup"] = row["bf16_us"] / row["best_us"]
            row["best_GB_per_s"] = (row["weight_bytes"] + c.io_bytes) / row["best_us"] / 1e3


def smoke(log) -> None:
    """CPU (TRITON_INTERPRET=1): the heuristic, v1 and every sweep candidate vs the reference on tiny shapes."""
    import os
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the Triton interpreter: set TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(0)
    bad = 0
    for N, K, M in [(72, 256, 1), (72, 256, 3), (72, 1024, 1), (200, 1024, 20)]:
        c = Case(N, K, M, gen, device="cpu")
        c.x = c.x.float()  # the interpreter runs fp32 dots; fp32 activations make the check tight
        for fmt in FORMATS:
            for cfg in [None, dict(KERNEL="v1")] + candidates(M, fmt):
                err = c.check(fmt, cfg)
                bad += err > 1e-4
                log(f"smoke {N}x{K} M={M} {fmt} {cfg}: err {err:.1e}{'  BROKEN' if err > 1e-4 else ''}")
    if bad:
        raise SystemExit(f"smoke: {bad} broken configs")
    log("smoke: all configs match the reference")


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


def _short(cfg) -> str:
    if not cfg:
        return "-"
    keys = [("KERNEL", ""), ("BLOCK_M", "m"), ("BLOCK_N", "n"), ("BLOCK_K", "k"), ("SPLIT_K", "s"), ("num_warps", "w"),
            ("num_stages", "st")]
    out = "/".join(f"{t}{cfg[k]}" for k, t in keys if k in cfg)
    for flag in ("SEM", "TWO_MUL", "FP8_CVT"):
        if flag in cfg:
            out += f" {flag}={int(bool(cfg[flag]))}"
    return out


def _table(rows) -> str:
    cols = ["N x K", "M", "format", "bf16 us", "bf16 GB/s", "q MB", "v1 us", "v1 x", "v2 us", "v2 GB/s", "v2 x",
            "best us", "best GB/s", "best x", "best config", "err"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        best_gbs = (r["weight_bytes"] + (r["M"] * r["K"] + r["M"] * r["N"]) * 2) / r["best_us"] / 1e3
        lines.append("| " + " | ".join([
            f"{r['N']}x{r['K']}", str(r["M"]), r["format"], f"{r['bf16_us']:.1f}", f"{r['bf16_GB_per_s']:.0f}",
            f"{r['weight_bytes'] / 1e6:.2f}", f"{r['v1_us']:.1f}", f"{r['v1_speedup']:.2f}x", f"{r['us']:.1f}",
            f"{r['GB_per_s']:.0f}", f"{r['speedup']:.2f}x", f"{r['best_us']:.1f}", f"{best_gbs:.0f}",
            f"{r['best_speedup']:.2f}x", _short(r["best_config"]), f"{r['rel_rmse_vs_ref']:.1e}"]) + " |")
    return "\n".join(lines)


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in p.lower().split("x")) for p in text.split(",") if p]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="quant.json")
    ap.add_argument("--budget", type=float, default=110.0,
                    help="seconds from the start; the launch-config sweep stops after")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--skip-dualquant", action="store_true")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK list, e.g. 4096x14336")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="activation row counts, e.g. 1,32")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--smoke", action="store_true", help="CPU check of every config (needs TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    start = time.monotonic()
    log = lambda m: print(m, flush=True)  # noqa: E731
    if a.smoke:
        smoke(log)
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_quant needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    shapes, ms, formats = _pairs(a.shapes), [int(m) for m in a.ms.split(",")], a.formats.split(",")
    import triton
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "argv": list(argv) if argv is not None else __import__("sys").argv[1:],
           "mode": "W4A16 (mxfp4, nvfp4) / W8A16 (mxfp8_e4m3) weight-only, DualQuant layout (x * s fused), "
                   "bf16 activations",
           "notes": ["times per call inside a CUDA graph; weights rotated over > 4x L2 so each call reads HBM",
                     "v1_*: the previous kernels under their heuristic; us/speedup: the v2 heuristic; best_*: "
                     "the fastest correct config of the sweep (v2 heuristic included)",
                     "Hopper has no FP4 tensor cores: W4A4 would be emulated (fake-quantized activations), "
                     "so only weight-only decode speed is measured"]}

    def save():
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)

    cases: dict = {}
    doc["gemv"] = bench_gemv(log, shapes, ms, formats, cases)
    save()
    if not a.skip_dualquant:
        try:
            doc["dualquant"] = bench_dualquant(log)
        except Exception as e:  # noqa: BLE001 - keep the GEMV table
            doc["dualquant"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"DualQuant failed: {doc['dualquant']['error']}")
        save()
    if not a.no_sweep and time.monotonic() < start + a.budget:
        sweep(doc["gemv"], cases, start + a.budget, log)
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
