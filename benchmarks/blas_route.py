"""fp32 `F.linear` on cuBLAS against cuBLASLt (and bf16 on cuBLAS) over the embedded models' and drafters' linear
shapes, 1–256 rows, CUDA-graph timing: the measurement behind synodic/engine/blas.py's LT_ROWS.

    python -m benchmarks.blas_route --out blas_route.json      # GPU only"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks._cli import out_file

# (in, out) of every linear in tiny_mamba2 / tiny_gdn and their drafters, fused projections included
SHAPES = [(256, 384), (384, 8), (384, 128), (384, 384), (384, 640), (384, 768), (384, 776), (384, 902), (384, 1024),
          (384, 2048), (384, 4096), (1024, 384), (1152, 384), (640, 384)]
ROWS = [1, 2, 4, 8, 16, 24, 32, 64, 128, 256]


def graph_us(fn, calls: int = 10, reps: int = 40) -> float:
    """µs per call of `fn`, `calls` of it captured in one CUDA graph and replayed `reps` times."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (reps * calls)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default=Path("blas_route.json"))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.blas_route: needs a CUDA device")
    rows = []
    before = torch.backends.cuda.preferred_blas_library()
    for K, N in SHAPES:
        w = torch.randn(N, K, device="cuda")
        wb = w.bfloat16()
        for M in ROWS:
            x = torch.randn(M, K, device="cuda")
            xb = x.bfloat16()
            times = {}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                times[lib] = graph_us(lambda x=x, w=w: F.linear(x, w))
            torch.backends.cuda.preferred_blas_library("cublas")
            times["bf16_cublas"] = graph_us(lambda xb=xb, wb=wb: F.linear(xb, wb))
            rows.append({"in": K, "out": N, "rows": M, **{k: round(v, 2) for k, v in times.items()}})
            print(f"K={K:5d} N={N:5d} M={M:4d} " + " ".join(f"{k} {v:6.1f}" for k, v in times.items()), flush=True)
    torch.backends.cuda.preferred_blas_library(before)
    a.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "us": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
