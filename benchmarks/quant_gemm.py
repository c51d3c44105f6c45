"""Benchmark of the tensor-core GEMM over the stored layout (KERNEL 'tc', kernels/quant_linear/tc.py) against bf16
F.linear, the stored-layout default kernels and the libraries that run here, on the presets' linear shapes at 2-256
rows; writes a JSON result.

    python -m benchmarks.quant_gemm --out gemm.json [--budget 170] [--models nemotron_h_8b,qwen35_gdn_4b]
        [--max-shapes 5] [--shapes 14336x4096,...] [--ms 2,4,8,16,32,64,128,256]
        [--formats mxfp4,nvfp4,mxfp8_e4m3] [--no-libs] [--libs-path .whl/site]

1. Per (shape, format, M), heaviest shapes first: bf16 F.linear; "stored" = the stored-layout kernels' default
   (gemvh / dotp, tuned table first: what a layer runs up to its packed-row limit); "tc" = the tc kernel at its
   heuristic config (`launch.tc_config`) and, until --budget seconds from the start, every tc config of
   benchmarks.quant_linear's sweep (the fastest kept as "tc_best"); "kgemm" = the plane-layout GEMM (kgemm.py over
   its own packed copy, its default / tuned config), so one run decides between the two unrouted GEMMs; ratios
   bf16 us / kernel us. Every kernel is
   checked against the torch reference first (rel. RMSE <= 2e-2) and timed as benchmarks.quant_linear times (a
   CUDA graph of calls cycling over weight copies > 4x L2: HBM reads).
2. Libraries, on the first two shapes: gemlite (pure Python + Triton; A16W4_MXFP / A16W4_NVFP / A16W8_MXFP from
   the same bf16 weight) and torch's own int4 tinygemm (_weight_int4pack_mm, INT4 g64) when they import and run;
   each failure is recorded as "not available: <reason>" and the run goes on.
Every cell is guarded: an error is recorded in its entry and the next cell runs. The JSON is rewritten after each
shape.

    python -m benchmarks.quant_gemm --kgemm --out kgemm.json [...]    # the plane-layout GEMM instead (kgemm.py):
                                                                    # benchmarks/quant_kgemm.py, < 4 min
    python -m benchmarks.quant_gemm --apply-kgemm kgemm.json        # its winners into the GPU's tuned table
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._cli import out_file

MS = [2, 4, 8, 16, 32, 64, 128, 256]
FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3"]
BENCH_SHAPE = (14336, 4096)
CHECK_TOL = 2e-2
LIB_BUDGET_S = 45.0  # seconds the library comparison may take (gemlite autotunes on first calls)


def shapes_of(models: list[str], max_shapes: int) -> list[tuple[int, int]]:
    """The bench's 14336x4096 first, then the presets' quantized linear shapes, most weight bytes first."""
    from benchmarks.tune_quant import model_shapes
    weight: dict[tuple[int, int], int] = {}
    for m in models:
        for nk, c in model_shapes(m, "mxfp4").items():
            weight[nk] = weight.get(nk, 0) + c * nk[0] * nk[1]
    out = [BENCH_SHAPE] + [s for s in sorted(weight, key=lambda s: -weight[s]) if s != BENCH_SHAPE]
    return out[:max_shapes]


def tc_candidates(M: int, fmt: str) -> list[dict]:
    """The tc kernel's heuristic config first, then benchmarks.quant_linear's tc sweep configs for M rows."""
    from synodic.kernels.quant_linear.launch import tc_config

    from benchmarks.quant_linear import candidates
    from benchmarks.tune_quant import unique_configs
    return unique_configs([tc_config(M, fmt)] + candidates(M, fmt, ("tc",)))


class Cell:
    """One (N, K, format): the bf16 weight and its quantized copies (enough to rotate > 4x L2)."""

    def __init__(self, N: int, K: int, fmt: str, gen):
        from benchmarks.quant_linear import _copies
        from synodic.quant import quantize
        self.N, self.K, self.fmt = N, K, fmt
        self.w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        self.s = torch.rand(K, device="cuda", generator=gen) + 0.5
        q = quantize(self.w.float() / self.s, fmt)
        n = _copies(q.nbytes())
        self.qs = [q] + [type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                                 None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
                         for _ in range(n - 1)]
        self.ks = None  # the plane layout of each copy, built on first use (time_kernel(kgemm=True))
        self.gen = gen

    def x(self, M: int) -> torch.Tensor:
        return torch.randn(M, self.K, device="cuda", generator=self.gen).to(torch.bfloat16)


def _timer(fast: bool):
    return graph_timer(warmup_ms=10 if fast else 20, rep_ms=40 if fast else 60)


def graph_timer(warmup_ms: float, rep_ms: float):
    """fns -> us per call: CUDA-graph timing over >= 24 calls cycling through fns (the weight copies)."""
    from synodic.kernels.timing import graph_us

    def t(fns):
        return graph_us(fns, calls=max(len(fns), 24), warmup_ms=warmup_ms, rep_ms=rep_ms)
    return t


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    e = ((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
    return e if math.isfinite(e) else float("inf")


def bf16_us(N: int, K: int, M: int, gen, timer) -> float:
    import torch.nn.functional as F

    from benchmarks.quant_linear import _copies
    w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    ws = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
    x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    us = timer([lambda w=w: F.linear(x, w) for w in ws])
    del ws, w
    return us


def time_kernel(cell: Cell, x: torch.Tensor, config, timer, kgemm: bool = False) -> dict:
    """Check (vs the torch reference) and time the stored-layout kernel a config picks (None: the default), or with
    kgemm=True the plane-layout GEMM on the cell's weights packed for it (its default / tuned config)."""
    from synodic.kernels.quant_linear import pack_kmajor, quant_linear
    ref = quant_linear(x, cell.qs[0], cell.s, backend="ref")
    if kgemm and cell.ks is None:
        cell.ks = [pack_kmajor(q) for q in cell.qs]
    ws = cell.ks if kgemm else cell.qs
    err = max(_err(quant_linear(x, ws[0], cell.s, backend="triton", config=config), ref) for _ in range(2))
    if err > CHECK_TOL:
        return {"err": err, "error": f"rel. RMSE {err:.2e} > {CHECK_TOL}: not timed"}
    us = timer([lambda w=w: quant_linear(x, w, cell.s, backend="triton", config=config) for w in ws])
    return {"err": err, "us": us}


def _guard(fn, *a, **kw) -> dict:
    try:
        return fn(*a, **kw)
    except Exception as e:  # noqa: BLE001 - one failing variant must not end the run
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def bench_shape(N: int, K: int, ms: list[int], formats: list[str], gen, log, deadline: float) -> list[dict]:
    from synodic.kernels.quant_linear.launch import resolve_config, tuned_config
    timer = _timer(False)
    rows = []
    base = {M: _guard(lambda M=M: {"us": bf16_us(N, K, M, gen, timer)}) for M in ms}
    dev = torch.device("cuda")
    for fmt in formats:
        try:
            cell = Cell(N, K, fmt, gen)
        except Exception as e:  # noqa: BLE001
            rows.append({"N": N, "K": K, "format": fmt, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        for M in ms:
            x = cell.x(M)
            row = {"N": N, "K": K, "M": M, "format": fmt, "bf16_us": base[M].get("us"), "bf16_error": base[M].get(
                "error")}
            stored = _guard(time_kernel, cell, x, None, timer)
            row.update({f"stored_{k}": v for k, v in stored.items()})
            row["stored_config"] = resolve_config(M, N, K, fmt, tuned_config(M, N, K, fmt, dev))
            cands = tc_candidates(M, fmt)
            tried = [dict(config=cands[0], **_guard(time_kernel, cell, x, cands[0], timer))]
            for cfg in cands[1:]:
                if time.monotonic() > deadline:
                    break
                tried.append(dict(config=cfg, **_guard(time_kernel, cell, x, cfg, timer)))
            row.update({f"tc_{k}": v for k, v in tried[0].items()})
            row.update({f"kgemm_{k}": v for k, v in _guard(time_kernel, cell, x, None, timer, True).items()})
            timed = [t for t in tried if "us" in t]
            if timed:
                best = min(timed, key=lambda t: t["us"])
                row.update(tc_best_us=best["us"], tc_best_config=best["config"])
            row["tc_tried"] = tried
            for k in ("stored", "tc", "tc_best", "kgemm"):
                if row.get(f"{k}_us") and row["bf16_us"]:
                    row[f"{k}_x_bf16"] = row["bf16_us"] / row[f"{k}_us"]
            log(f"{N}x{K} {fmt} M={M}: bf16 {_f(row['bf16_us'])} us, stored {_f(row.get('stored_us'))} us "
                f"({_f(row.get('stored_x_bf16'), 2)}x), tc {_f(row.get('tc_us'))} us "
                f"({_f(row.get('tc_x_bf16'), 2)}x), best tc {_f(row.get('tc_best_us'))} us ({len(timed)} of "
                f"{len(tried)} configs), kgemm {_f(row.get('kgemm_us'))} us ({_f(row.get('kgemm_x_bf16'), 2)}x)"
                + "".join(f"  {k}: {row[k]}" for k in ("tc_error", "kgemm_error", "stored_error", "bf16_error")
                          if row.get(k)))
            rows.append(row)
        del cell
        torch.cuda.empty_cache()
    return rows


def _f(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def bench_libs(shapes: list[tuple[int, int]], ms: list[int], gen, deadline: float, log) -> dict:
    """gemlite and torch's int4 tinygemm on the same shapes; {"<lib> <variant>": rows or "not available: ..."}."""
    timer = _timer(True)
    out: dict = {}
    try:
        import gemlite
        import gemlite.helper  # the A16W* classes live here, not at the package top level
        out["gemlite_version"] = getattr(gemlite, "__version__", "?")
        # its H100 autotune cache (it names no H200 file): fewer first-call autotunes
        cache = Path(gemlite.__file__).parent / "configs" / "h100.json"
        if cache.exists():
            gemlite.core.GemLiteLinearTriton.load_config(str(cache))
        variants = {"gemlite A16W4_MXFP": "A16W4_MXFP", "gemlite A16W4_NVFP": "A16W4_NVFP",
                    "gemlite A16W8_MXFP": "A16W8_MXFP"}
    except Exception as e:  # noqa: BLE001
        out["gemlite"] = f"not available: {type(e).__name__}: {str(e)[:200]}"
        variants = {}
    for name, cls in variants.items():
        rows = []
        for N, K in shapes:
            try:
                lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    lin.weight.copy_((torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16))
                ref_w = lin.weight.detach().clone()
                mod = getattr(gemlite.helper, cls)(device="cuda", dtype=torch.bfloat16).from_linear(lin)
            except Exception as e:  # noqa: BLE001
                out[name] = f"not available: {type(e).__name__}: {str(e)[:200]}"
                break

            def measure(x, mod=mod, ref_w=ref_w):
                err = _err(mod(x).float(), x.float() @ ref_w.float().T)  # incl. its own quantization error
                return {"us": timer([lambda mod=mod, x=x: mod(x)]), "err_vs_bf16": err,
                        "note": "one weight copy (may sit in L2 for small shapes)"}

            rows += _lib_rows(name, N, K, ms, gen, deadline, log, measure)
            mod = measure = None
        if name not in out:
            out[name] = rows
    out["torch int4 tinygemm g64"] = _tinygemm(shapes, ms, gen, deadline, timer, log)
    return out


def _tinygemm(shapes, ms, gen, deadline, timer, log):
    """torch.ops.aten._weight_int4pack_mm (INT4, group 64, bf16 scale and zero point): PyTorch's own W4A16."""
    from benchmarks.quant_linear import _copies
    rows = []
    for N, K in shapes:
        try:
            g = 64
            w = torch.randn(N, K, device="cuda", generator=gen) * 0.02
            wg = w.reshape(N, K // g, g)
            lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((hi - lo) / 15).clamp_min(1e-8)
            q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
            zero = lo + 8 * scale  # tinygemm: w = (q - 8) * scale + zero
            sz = torch.cat([scale, zero], -1).reshape(N, K // g, 2).transpose(0, 1).contiguous().to(torch.bfloat16)
            packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            wp = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
            deq = ((q.reshape(N, K // g, g) - 8) * scale + zero).reshape(N, K)
            wps = [wp] + [wp.clone() for _ in range(_copies(N * K // 2) - 1)]
        except Exception as e:  # noqa: BLE001
            return f"not available: {type(e).__name__}: {str(e)[:200]}"

        def measure(x, wp=wp, sz=sz, g=g, deq=deq, wps=wps):
            y = torch.ops.aten._weight_int4pack_mm(x, wp, g, sz)
            err = _err(y.float(), x.float() @ deq.T)
            us = timer([lambda w=w, x=x, sz=sz, g=g: torch.ops.aten._weight_int4pack_mm(x, w, g, sz) for w in wps])
            return {"us": us, "err_vs_its_dequant": err}

        rows += _lib_rows("tinygemm", N, K, ms, gen, deadline, log, measure)
    return rows


def _lib_rows(name, N, K, ms, gen, deadline, log, measure) -> list[dict]:
    """One library's rows for the shape (N, K) over ms: {"N", "K", "M"} + measure(x) for random bf16 x [M, K]
    (an exception becomes the row's "error"); once the time budget is spent, rows say so and nothing runs."""
    rows = []
    for M in ms:
        if time.monotonic() > deadline:
            rows.append({"N": N, "K": K, "M": M, "error": "library time budget spent"})
            continue
        try:
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            rows.append({"N": N, "K": K, "M": M, **measure(x)})
        except Exception as e:  # noqa: BLE001
            rows.append({"N": N, "K": K, "M": M, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        log(f"{name} {N}x{K} M={M}: {rows[-1].get('us', rows[-1].get('error'))}")
    return rows


def summary(rows: list[dict]) -> dict:
    """Per format and M: min / median of bf16 us / best tc us over the shapes (the targets' quantity)."""
    out: dict = {}
    for r in rows:
        if r.get("tc_best_x_bf16"):
            out.setdefault(r["format"], {}).setdefault(str(r["M"]), []).append(r["tc_best_x_bf16"])
    return {f: {m: {"min": min(v), "median": statistics.median(v), "shapes": len(v)} for m, v in d.items()}
            for f, d in out.items()}


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in p.lower().split("x")) for p in text.split(",") if p]


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if "--kgemm" in args:
        from benchmarks.quant_kgemm import main as kgemm_main
        return kgemm_main(args)
    if "--apply-kgemm" in args:
        from benchmarks.quant_kgemm import apply_section
        i = args.index("--apply-kgemm")
        table = args[args.index("--table") + 1] if "--table" in args else None
        return apply_section(Path(args[i + 1]), Path(table) if table else None)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=out_file, default="gemm.json")
    ap.add_argument("--budget", type=float, default=170.0, help="seconds from the start; tc's sweep stops after")
    ap.add_argument("--models", default="nemotron_h_8b,qwen35_gdn_4b")
    ap.add_argument("--max-shapes", type=int, default=5)
    ap.add_argument("--shapes", default=None, help="NxK list (overrides --models / --max-shapes)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-libs", action="store_true")
    ap.add_argument("--libs-path", default=".whl/site", help="a directory of carried pure-Python packages "
                    "(gemlite), put first on sys.path when it exists")
    a = ap.parse_args(argv)
    start = time.monotonic()
    log = lambda m: print(f"[{time.monotonic() - start:5.0f}s] {m}", flush=True)  # noqa: E731
    if not torch.cuda.is_available():
        raise SystemExit("quant_gemm needs a CUDA GPU (the kernels' CPU checks are the tests)")
    try:
        ms = [int(m) for m in a.ms.split(",")]
        shapes = _pairs(a.shapes) if a.shapes else shapes_of(a.models.split(","), a.max_shapes)
    except ValueError as e:
        print(f"quant_gemm: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    formats = a.formats.split(",")
    bad = [f for f in formats if f not in ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")]
    if bad:
        print(f"quant_gemm: --formats {bad[0]!r}: expected mxfp4, nvfp4, mxfp8_e4m3 or mxfp8_e5m2", file=sys.stderr)
        raise SystemExit(2)
    if os.path.isdir(a.libs_path):
        sys.path.insert(0, os.path.abspath(a.libs_path))
    import triton
    doc = {"gpu": torch.cuda.get_device_name(0), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(
               timespec="seconds"), "torch": torch.__version__, "triton": triton.__version__,
           "command": "python -m benchmarks.quant_gemm " + " ".join(sys.argv[1:] if argv is None else argv),
           "python": platform.python_version(), "shapes": shapes, "ms": ms, "formats": formats,
           "notes": ["us per call in a CUDA graph over weight copies > 4x L2 (HBM reads); x_bf16 = bf16 us / us",
                     "stored: the stored-layout kernels' default (gemvh / dotp); tc: the stored-layout tensor-core "
                     "GEMM (tc.py) at its heuristic config, tc_best: the fastest of its sweep configs; kgemm: the "
                     "plane-layout GEMM (kgemm.py) at its default / tuned config",
                     "W4A16 / W8A16 with the DualQuant input-channel multiplier s fused; bf16 activations"],
           "bench": []}

    def save():
        doc["summary"] = summary(doc["bench"])
        doc["elapsed_s"] = time.monotonic() - start
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")

    gen = torch.Generator(device="cuda").manual_seed(0)
    for N, K in shapes:
        doc["bench"] += bench_shape(N, K, ms, formats, gen, log, start + a.budget)
        save()
    if not a.no_libs:
        doc["libraries"] = bench_libs(shapes[:2], ms, gen, time.monotonic() + LIB_BUDGET_S, log)
    save()
    for f, d in doc["summary"].items():
        log(f"{f}: best tc x bf16 (min / median over shapes) " + ", ".join(
            f"M={m} {v['min']:.2f}/{v['median']:.2f}" for m, v in d.items()))
    log(f"wrote {a.out}")

if __name__ == "__main__":
    main()
