"""Benchmark + tuner of the packed GEMM (KERNEL 'gemm', repacked weights) against bf16 F.linear, the stored-layout
kernels and the libraries that run here, on the presets' linear shapes at 1-256 rows; writes a JSON result and the
GPU's tuned table's "gemm" section.

    python -m benchmarks.quant_gemm --out gemm.json [--budget 170] [--models nemotron_h_8b,qwen35_gdn_4b]
        [--max-shapes 5] [--shapes 14336x4096,...] [--ms 1,2,4,8,16,32,64,128,256]
        [--formats mxfp4,nvfp4,mxfp8_e4m3] [--no-tune] [--no-libs] [--libs-path .whl/site] [--table PATH]

1. Per (shape, format, M), heaviest shapes first: bf16 F.linear; "lean" = what a layer without a dense copy runs
   (M = 1: the packed GEMV on the stored layout; M >= 2: the GEMM, tuned table entry or heuristic); "stored" = the
   stored-layout kernels' default (gemvh / dotp, what a layer with a dense copy runs up to KERNEL_MAX_ROWS); ratios
   bf16 us / kernel us. Every kernel is checked against the torch reference first (rel. RMSE <= 2e-2) and timed
   as benchmarks.quant_linear times (a CUDA graph of calls cycling over weight copies > 4x L2: HBM reads).
2. Tuning (until --budget seconds from the start): per (format, N, K, M >= 2) a small config space around the
   heuristic (tiles, orientation, stages, K split); the three fastest timed twice more, the winner kept if it beats
   the heuristic's median by tune_quant.MIN_GAIN; the table is rewritten after every shape (other sections kept).
3. Libraries, on the first two shapes: gemlite (pure Python + Triton; A16W4_MXFP / A16W4_NVFP / A16W8_MXFP from
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

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
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


def gemm_candidates(M: int, N: int, KP: int, fmt: str, sms: int) -> list[dict]:
    """The heuristic's config first, then a small space: tiles x orientation x stages, the K split of each tile
    (and its double / half for one tile)."""
    from synodic.kernels.quant_linear.launch import resolve_gemm_config

    from benchmarks.tune_quant import unique_configs
    packed = fmt in ("mxfp4", "nvfp4")
    h = 1 if packed else 2  # 8-bit: half the BLOCK_K (same bytes per row)
    bm = min(64, max(16, 1 << (M - 1).bit_length()))
    space = []
    if M <= 64:
        space += [dict(SWAP=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk // h, num_warps=4, num_stages=st)
                  for bn, bk, st in ((64, 256, 4), (128, 256, 3), (64, 512, 3), (128, 128, 4), (64, 128, 5))]
    if M >= 32:
        space += [dict(SWAP=0, BLOCK_M=b, BLOCK_N=bn, BLOCK_K=bk // h, num_warps=nw, num_stages=st)
                  for b, bn, bk, nw, st in ((64, 128, 128, 4, 4), (64, 128, 256, 4, 3), (128, 128, 128, 8, 3),
                                            (128, 256, 128, 8, 3), (128, 128, 256, 8, 2))
                  if b <= max(64, 1 << (M - 1).bit_length())]
    base = resolve_gemm_config(M, N, KP, fmt, None, sms)
    out = [base, dict(base, SPLIT_K=max(1, base["SPLIT_K"] // 2)), dict(base, SPLIT_K=min(64, base["SPLIT_K"] * 2))]
    out += [resolve_gemm_config(M, N, KP, fmt, c, sms) for c in space]
    return unique_configs(out)


class Cell:
    """One (N, K, format): the bf16 weight, its quantized + repacked copies (enough to rotate > 4x L2)."""

    def __init__(self, N: int, K: int, fmt: str, gen):
        from synodic.kernels.quant_linear import repack

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
        self.gs = [repack(qc) for qc in self.qs]
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


def time_kernel(cell: Cell, x: torch.Tensor, gemm: bool, config, timer) -> dict:
    """Check (vs the torch reference) and time the GEMM (gemm=True, repacked weights) or the stored-layout kernels."""
    from synodic.kernels.quant_linear import quant_linear
    ref = quant_linear(x, cell.qs[0], cell.s, backend="ref")
    ws = cell.gs if gemm else cell.qs
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


def bench_shape(N: int, K: int, ms: list[int], formats: list[str], gen, log) -> list[dict]:
    from synodic.kernels.quant_linear.launch import resolve_config, resolve_gemm_config, tuned_config, tuned_gemm_config
    timer = _timer(False)
    rows = []
    base = {M: _guard(lambda M=M: {"us": bf16_us(N, K, M, gen, timer)}) for M in ms}
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
            dev = torch.device("cuda")
            if M == 1:  # the lean layer's one-row path is the stored-layout GEMV
                lean = _guard(time_kernel, cell, x, False, None, timer)
                row["lean_config"] = resolve_config(M, N, K, fmt, tuned_config(M, N, K, fmt, dev))
                # the GEMM at one row too: whether it could replace the GEMV (and the stored-layout copy)
                one = _guard(time_kernel, cell, x, True, None, timer)
                row.update({f"gemm1_{k}": v for k, v in one.items()})
                if one.get("us") and row["bf16_us"]:
                    row["gemm1_x_bf16"] = row["bf16_us"] / one["us"]
            else:
                lean = _guard(time_kernel, cell, x, True, None, timer)
                row["lean_config"] = resolve_gemm_config(M, N, cell.gs[0].KP, fmt, tuned_gemm_config(M, N, K, fmt,
                                                                                                        dev))
                stored = _guard(time_kernel, cell, x, False, None, timer)
                row.update({f"stored_{k}": v for k, v in stored.items()})
                row["stored_config"] = resolve_config(M, N, K, fmt, tuned_config(M, N, K, fmt, dev))
            row.update({f"lean_{k}": v for k, v in lean.items()})
            for k in ("lean", "stored"):
                if row.get(f"{k}_us") and row["bf16_us"]:
                    row[f"{k}_x_bf16"] = row["bf16_us"] / row[f"{k}_us"]
            log(f"{N}x{K} {fmt} M={M}: bf16 {_f(row['bf16_us'])} us, lean {_f(row.get('lean_us'))} us "
                f"({_f(row.get('lean_x_bf16'), 2)}x), stored {_f(row.get('stored_us'))} us "
                f"({_f(row.get('stored_x_bf16'), 2)}x)" + "".join(
                    f"  {k}: {row[k]}" for k in ("lean_error", "stored_error", "bf16_error") if row.get(k)))
            rows.append(row)
        del cell
        torch.cuda.empty_cache()
    return rows


def _f(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def tune_shape(N: int, K: int, ms: list[int], formats: list[str], gen, deadline: float, configs: dict, log) -> list:
    """Tunes the GEMM's configs for one shape (rows >= 2); updates `configs` (the table's "gemm" section)."""
    from synodic.kernels.quant_linear import tuned as tuned_mod
    from synodic.kernels.quant_linear.launch import _sms

    from benchmarks.tune_quant import MIN_GAIN, RETIME, choose
    timer = _timer(True)
    sms = _sms(torch.device("cuda"))
    out = []
    for fmt in formats:
        cell = None
        for M in [m for m in ms if m >= 2]:
            if time.monotonic() > deadline:
                return out
            b = tuned_mod.gemm_bucket(M)
            if b != M:  # the table holds bucket rows only
                continue
            try:
                cell = cell or Cell(N, K, fmt, gen)
                x = cell.x(M)
                cands = gemm_candidates(M, N, cell.gs[0].KP, fmt, sms)
                times, kept_cfgs, errs = {}, [], []
                for cfg in cands:
                    if time.monotonic() > deadline:
                        break
                    r = _guard(time_kernel, cell, x, True, cfg, timer)
                    if "us" not in r:
                        errs.append({"config": cfg, **r})
                        if not kept_cfgs:
                            raise RuntimeError(f"the heuristic config {cfg} failed: {r.get('error')}")
                        continue
                    times[len(kept_cfgs)] = [r["us"]]
                    kept_cfgs.append(cfg)
                top = sorted(times, key=lambda j: times[j][0])[:RETIME]
                top = top if 0 in top else top[:RETIME - 1] + [0]
                for _ in range(2):
                    for j in top:
                        times[j].append(_guard(time_kernel, cell, x, True, kept_cfgs[j], timer).get("us", math.inf))
                kept = choose({j: times[j] for j in top})
                key = tuned_mod.key(fmt, N, K, M)
                if kept:
                    configs[key] = kept_cfgs[kept]
                else:
                    configs.pop(key, None)
                ent = {"N": N, "K": K, "M": M, "format": fmt, "heuristic_us": statistics.median(times[0]),
                       "kept_us": statistics.median(times[kept]), "kept": kept_cfgs[kept], "tried": len(kept_cfgs),
                       "min_gain": MIN_GAIN, "failed": errs}
                log(f"tune {N}x{K} {fmt} M={M}: heuristic {ent['heuristic_us']:.1f} us, kept {ent['kept_us']:.1f} "
                    f"us ({'table' if kept else 'heuristic'}; {len(kept_cfgs)} configs, {len(errs)} failed)")
            except Exception as e:  # noqa: BLE001
                ent = {"N": N, "K": K, "M": M, "format": fmt, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                log(f"tune {N}x{K} {fmt} M={M}: {ent['error']}")
            out.append(ent)
        del cell
        torch.cuda.empty_cache()
    return out


def write_table(path: Path, run_meta: dict, gemm_configs: dict) -> None:
    """Rewrites the table's "gemm" section (atomically), keeping its other sections, appending the run record."""
    data = json.loads(path.read_text()) if path.exists() else {"meta": {"runs": []}, "configs": {}}
    data.setdefault("meta", {}).setdefault("runs", [])
    if run_meta not in data["meta"]["runs"]:
        data["meta"]["runs"].append(run_meta)
    data["gemm"] = dict(sorted(gemm_configs.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


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
    """Per format and M: min / median of bf16 us / lean us over the shapes (the targets' quantity)."""
    out: dict = {}
    for r in rows:
        if r.get("lean_x_bf16"):
            out.setdefault(r["format"], {}).setdefault(str(r["M"]), []).append(r["lean_x_bf16"])
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
    ap.add_argument("--out", default="gemm.json")
    ap.add_argument("--budget", type=float, default=170.0, help="seconds from the start; tuning stops after")
    ap.add_argument("--models", default="nemotron_h_8b,qwen35_gdn_4b")
    ap.add_argument("--max-shapes", type=int, default=5)
    ap.add_argument("--shapes", default=None, help="NxK list (overrides --models / --max-shapes)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--no-libs", action="store_true")
    ap.add_argument("--libs-path", default=".whl/site", help="a directory of carried pure-Python packages "
                    "(gemlite), put first on sys.path when it exists")
    ap.add_argument("--table", default=None, help="tuned table file (default: this GPU's under quant_linear/tuned/)")
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
    from synodic.kernels.quant_linear import tuned as tuned_mod
    name = torch.cuda.get_device_name(0)
    table = Path(a.table) if a.table else tuned_mod.table_path(name)
    run_meta = {"gpu": name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "torch": torch.__version__, "triton": triton.__version__,
                "command": "python -m benchmarks.quant_gemm " + " ".join(sys.argv[1:] if argv is None else argv)}
    doc = {**run_meta, "python": platform.python_version(), "shapes": shapes, "ms": ms, "formats": formats,
           "notes": ["us per call in a CUDA graph over weight copies > 4x L2 (HBM reads); x_bf16 = bf16 us / us",
                     "lean: a layer without a dense copy (M = 1 packed GEMV, M >= 2 the packed GEMM on repacked "
                     "weights); stored: the stored-layout kernels' default (gemvh / dotp)",
                     "W4A16 / W8A16 with the DualQuant input-channel multiplier s fused; bf16 activations"],
           "bench": [], "tune": []}

    def save():
        doc["summary"] = summary(doc["bench"])
        bf = {(r["N"], r["K"], r["M"]): r["bf16_us"] for r in doc["bench"] if r.get("bf16_us")}
        for t in doc["tune"]:
            if "kept_us" in t and (t["N"], t["K"], t["M"]) in bf:
                t["kept_x_bf16"] = bf[(t["N"], t["K"], t["M"])] / t["kept_us"]
        doc["elapsed_s"] = time.monotonic() - start
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")

    gen = torch.Generator(device="cuda").manual_seed(0)
    for N, K in shapes:
        doc["bench"] += bench_shape(N, K, ms, formats, gen, log)
        save()
    if not a.no_tune:
        configs = dict(tuned_mod.load.__wrapped__(table, "gemm")) if table.exists() else {}
        for N, K in shapes:
            if time.monotonic() > start + a.budget:
                log("tuning stopped: --budget spent")
                break
            doc["tune"] += tune_shape(N, K, ms, formats, gen, start + a.budget, configs, log)
            write_table(table, run_meta, configs)
            save()
        doc["table"] = str(table)
    if not a.no_libs:
        doc["libraries"] = bench_libs(shapes[:2], ms, gen, time.monotonic() + LIB_BUDGET_S, log)
        save()
    save()
    for f, d in doc["summary"].items():
        log(f"{f}: lean x bf16 (min / median over shapes) " + ", ".join(
            f"M={m} {v['min']:.2f}/{v['median']:.2f}" for m, v in d.items()))
    log(f"wrote {a.out}" + (f" and {table}" if not a.no_tune else ""))


if __name__ == "__main__":
    main()
