"""The plane-layout GEMM (KERNEL 'kgemm', kernels/quant_linear/kgemm.py) against bf16 F.linear, the stored-layout
kernels (what a layer runs today) and gemlite, on the bench and preset linear shapes at 1-256 rows, in one run
bounded to a few minutes; `python -m benchmarks.quant_gemm --kgemm` runs it.

    python -m benchmarks.quant_gemm --kgemm --out kgemm.json [--budget 210] [--shapes 14336x4096,...]
        [--ms 1,2,4,8,16,32,64,128,256] [--formats mxfp4,nvfp4,mxfp8_e4m3] [--no-libs] [--workers 12]
    python -m benchmarks.quant_gemm --apply-kgemm kgemm.json      # its winners into this GPU's tuned table

1. Compile: every kgemm candidate tile (a few per row bucket; one compile serves every shape, row count and K
   split) and the stored-layout kernels' default per shape and row count, in parallel worker processes (spawned,
   on the same GPU), so the timing loop finds Triton's on-disk cache warm.
2. Per (shape, format, M), heaviest shape first: bf16 F.linear; "stored" = the stored-layout kernels' default
   (gemvh / dotp; tuned table first); "kgemm" = each candidate config, checked against the torch reference first
   (rel. RMSE <= 2e-2), the fastest kept. Timing as benchmarks.quant_linear: one CUDA graph of calls cycling over
   weight copies > 4x L2 (HBM reads). Points past --budget are recorded as skipped.
3. gemlite (if it imports; pure Python + Triton): A16W4_MXFP at M = 16..256 on the first shapes, its weight
   rotated the same way, its autotune mode per --gemlite-autotune, in whatever budget is left.
The JSON holds every point (all candidates' times), a summary per format and M (kgemm / bf16 and kgemm / the
current route), the rows where kgemm beats both on every shape (`suggest_kgemm_rows`, what
synodic.quant.linear.KGEMM_ROWS would take) and the winners as a tuned-table "kgemm" section.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._cli import out_file
from benchmarks.quant_gemm import _err, _f, _guard, _pairs, graph_timer
from benchmarks.quant_linear import _copies

DEV = "cuda"  # the CPU smoke test sets "cpu" (interpreter kernels, NaN times)
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3"]
# the bench shape, nemotron_h_8b's MLP up / down (the heaviest preset linears), qwen35_gdn_4b's most frequent one
SHAPES = [(14336, 4096), (21504, 4096), (4096, 21504), (9216, 2560)]
CHECK_TOL = 2e-2
WIN = 1.03  # kgemm must beat the other path by 3 % on every shape to be suggested
GEMLITE_MS = [16, 32, 64, 128, 256]

# (BLOCK_M, BLOCK_N, SWAP, ASM, num_warps, num_stages) per row bucket, the heuristic's tile first. Every one compiles
# for sm_90 without spills and within 227 KB of shared memory for every format (offline check; the x tile of a
# 256-code MXFP4 group is BLOCK_M x 512 bytes a stage, so [128 x 256] tiles and 4-warp BLOCK_N = 256 are out)
_TILES = {16: [(16, 128, 0, 1, 4, 4), (16, 64, 0, 1, 4, 4), (16, 128, 1, 1, 4, 4), (16, 128, 0, 0, 4, 4),
               (16, 256, 0, 1, 8, 3)],
          32: [(32, 128, 0, 1, 4, 4), (32, 64, 0, 1, 4, 4), (32, 128, 1, 1, 4, 4), (16, 128, 0, 1, 4, 4)],
          64: [(64, 128, 0, 1, 4, 3), (32, 128, 0, 1, 4, 4), (64, 128, 1, 1, 4, 3), (64, 128, 0, 1, 8, 3)],
          128: [(128, 128, 0, 1, 8, 3), (64, 128, 0, 1, 4, 3), (128, 128, 0, 1, 8, 2), (64, 128, 0, 1, 8, 3)],
          256: [(128, 128, 0, 1, 8, 3), (128, 128, 0, 1, 8, 2), (64, 128, 0, 1, 8, 3), (128, 128, 0, 0, 8, 3)]}


def tiles(M: int) -> list[tuple]:
    return _TILES[next(b for b in _TILES if M <= b) if M <= 256 else 256]


def candidates(M: int, N: int, G: int, fmt: str, sms: int) -> list[dict]:
    """Full configs: each tile with its heuristic K split, and the first tile's split doubled and halved (free:
    the split is a run-time value)."""
    from synodic.kernels.quant_linear.kgemm_launch import resolve_kgemm_config
    out = []
    for bm, bn, swap, asm, nw, st in tiles(M):
        out.append(resolve_kgemm_config(M, N, G, fmt, dict(BLOCK_M=bm, BLOCK_N=bn, SWAP=swap, ASM=asm, num_warps=nw,
                                                           num_stages=st), sms))
    sp = out[0]["SPLIT_K"]
    for alt in (sp * 2, sp // 2):
        if 1 <= alt <= 32 and G // alt >= 2:
            out.append(dict(out[0], SPLIT_K=alt))
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


# --- 1. parallel compile ------------------------------------------------------------------------------------------

def _warm_kgemm(fmt: str, tile_list: list[tuple]) -> int:
    """Worker: compile kgemm for tiles on a small weight (N, K multiples of 256: the same specialisation as every
    bench shape; M and the split are not specialised)."""
    from synodic.kernels.quant_linear import pack_kmajor, quant_linear

    from synodic.quant import quantize
    N, K = 256, 1024
    g = pack_kmajor(quantize(torch.randn(N, K, device="cuda") * 0.02, fmt))
    x = torch.randn(2, K, device="cuda").to(torch.bfloat16)
    s = torch.rand(K, device="cuda") + 0.5
    for bm, bn, swap, asm, nw, st in tile_list:
        try:
            quant_linear(x, g, s, backend="triton", config=dict(BLOCK_M=bm, BLOCK_N=bn, SWAP=swap, ASM=asm,
                                                                 num_warps=nw, num_stages=st, SPLIT_K=2))
        except Exception:  # noqa: BLE001 - the timing loop records the error
            pass
    torch.cuda.synchronize()
    return len(tile_list)


def _warm_stored(N: int, K: int, fmt: str, ms: list[int]) -> int:
    """Worker: compile the stored-layout kernels' defaults for one shape (their K split is a constexpr)."""
    from synodic.kernels.quant_linear import quant_linear

    from synodic.quant import quantize
    q = quantize(torch.randn(N, K, device="cuda") * 0.02, fmt)
    s = torch.rand(K, device="cuda") + 0.5
    for M in ms:
        try:
            quant_linear(torch.randn(M, K, device="cuda").to(torch.bfloat16), q, s, backend="triton")
        except Exception:  # noqa: BLE001
            pass
    torch.cuda.synchronize()
    return len(ms)


def precompile(shapes, formats, ms, workers: int, log, limit_s: float = 100.0) -> dict:
    """Warms Triton's disk cache in `workers` spawned processes; gives up after limit_s (the workers are then
    terminated: whatever they compiled is cached, the rest compiles in the timing loop)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    t0 = time.monotonic()
    uniq = list(dict.fromkeys(t for M in ms for t in tiles(M)))
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    jobs = [ex.submit(_warm_kgemm, fmt, uniq[i:i + 2]) for fmt in formats for i in range(0, len(uniq), 2)]
    jobs += [ex.submit(_warm_stored, N, K, fmt, ms) for N, K in shapes for fmt in formats]
    done, pending = cf.wait(jobs, timeout=limit_s)
    errs = []
    for j in done:
        try:
            j.result()
        except Exception as e:  # noqa: BLE001 - a failed warm-up only costs compile time later
            errs.append(f"{type(e).__name__}: {str(e)[:200]}")
    if pending:
        for p in list(getattr(ex, "_processes", {}).values()):  # a hung or slow worker must not stall the run
            p.terminate()
    ex.shutdown(wait=not pending, cancel_futures=True)
    log(f"precompiled {len(uniq)} kgemm tiles x {len(formats)} formats and the stored kernels of {len(shapes)} "
        f"shapes in {time.monotonic() - t0:.0f}s ({workers} workers, {len(errs)} failed, {len(pending)} cut off)")
    return {"s": time.monotonic() - t0, "jobs": len(jobs), "errors": errs[:5], "cut_off": len(pending)}


# --- 2. timing ----------------------------------------------------------------------------------------------------

class Cell:
    """One (N, K, format): quantized copies (stored layout) and their plane-layout copies, enough to rotate > 4x L2."""

    def __init__(self, N: int, K: int, fmt: str, gen):
        from synodic.kernels.quant_linear import pack_kmajor

        from synodic.quant import quantize
        self.N, self.K, self.fmt, self.gen = N, K, fmt, gen
        w = (torch.randn(N, K, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
        self.s = torch.rand(K, device=DEV, generator=gen) + 0.5
        q = quantize(w.float() / self.s, fmt)
        del w
        n = _copies(q.nbytes())
        self.qs = [q] + [type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                                 None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
                         for _ in range(n - 1)]
        self.ks = [pack_kmajor(qc) for qc in self.qs]
        self.G = self.ks[0].KP // self.ks[0].group

    def x(self, M: int) -> torch.Tensor:
        return torch.randn(M, self.K, device=DEV, generator=self.gen).to(torch.bfloat16)


def _timer():
    return graph_timer(warmup_ms=8, rep_ms=30)


def bf16_us(N: int, K: int, M: int, gen, timer) -> float:
    import torch.nn.functional as F
    w = (torch.randn(N, K, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    ws = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
    x = torch.randn(M, K, device=DEV, generator=gen).to(torch.bfloat16)
    return timer([lambda w=w: F.linear(x, w) for w in ws])


def time_path(ws, x, s, ref, config, timer) -> dict:
    """Check one call against the reference, then time calls cycling over the weight copies ws."""
    from synodic.kernels.quant_linear import quant_linear
    err = _err(quant_linear(x, ws[0], s, backend="triton", config=config), ref)
    if err > CHECK_TOL:
        return {"err": err, "error": f"rel. RMSE {err:.2e} > {CHECK_TOL}: not timed"}
    return {"err": err, "us": timer([lambda w=w: quant_linear(x, w, s, backend="triton", config=config)
                                     for w in ws])}


def current_route(fmt: str, M: int) -> str:
    """What a QuantLinear with a dense copy runs today for M bf16 rows: the stored-layout kernel or bf16."""
    from synodic.quant.linear import KERNEL_MAX_ROWS
    return "stored" if M <= KERNEL_MAX_ROWS[fmt] else "bf16"


def bench_shape(N, K, ms, formats, gen, deadline, log) -> list[dict]:
    from synodic.kernels.quant_linear import quant_linear
    from synodic.kernels.quant_linear.launch import _sms, resolve_config, tuned_config
    timer = _timer()
    sms = _sms(torch.device(DEV))
    rows = []
    base = {}
    for M in ms:
        base[M] = _guard(lambda M=M: {"us": bf16_us(N, K, M, gen, timer)}) if time.monotonic() < deadline else {}
    for fmt in formats:
        if time.monotonic() > deadline:
            rows += [{"N": N, "K": K, "M": M, "format": fmt, "skipped": "budget spent"} for M in ms]
            continue
        try:
            cell = Cell(N, K, fmt, gen)
        except Exception as e:  # noqa: BLE001
            rows.append({"N": N, "K": K, "format": fmt, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        for M in ms:
            row = {"N": N, "K": K, "M": M, "format": fmt, "bf16_us": base[M].get("us")}
            if time.monotonic() > deadline:
                rows.append(dict(row, skipped="budget spent"))
                continue
            x = cell.x(M)
            ref = quant_linear(x, cell.qs[0], cell.s, backend="ref")
            st = _guard(time_path, cell.qs, x, cell.s, ref, None, timer)
            row["stored_config"] = resolve_config(M, N, K, fmt, tuned_config(M, N, K, fmt, torch.device(DEV)),
                                                  sms)
            row.update({f"stored_{k}": v for k, v in st.items()})
            tried = []
            for cfg in candidates(M, N, cell.G, fmt, sms):
                r = _guard(time_path, cell.ks, x, cell.s, ref, cfg, timer)
                tried.append({"config": cfg, **r})
            ok = [t for t in tried if "us" in t]
            if ok:
                best = min(ok, key=lambda t: t["us"])
                row.update(kgemm_us=best["us"], kgemm_err=best["err"], kgemm_config=best["config"],
                           kgemm_heuristic_us=tried[0].get("us"))
            row["kgemm_tried"] = tried
            row["route"] = current_route(fmt, M)
            bf, kg, sto = row["bf16_us"], row.get("kgemm_us"), row.get("stored_us")
            if bf and kg:
                row["kgemm_x_bf16"] = bf / kg
            if bf and sto:
                row["stored_x_bf16"] = bf / sto
            cur = sto if row["route"] == "stored" else bf
            if cur and kg:
                row["kgemm_x_route"] = cur / kg
            log(f"{N}x{K} {fmt} M={M}: bf16 {_f(bf)} us, stored {_f(sto)} us, kgemm {_f(kg)} us "
                f"({_f(row.get('kgemm_x_bf16'), 2)}x bf16, {_f(row.get('kgemm_x_route'), 2)}x route; "
                f"{len(ok)}/{len(tried)} configs)" + (f"  stored: {row['stored_error']}" if "stored_error" in row
                                                     else "") + ("" if ok else f"  kgemm: {tried[0].get('error')}"))
            rows.append(row)
        del cell
        torch.cuda.empty_cache()
    return rows


# --- 3. gemlite ---------------------------------------------------------------------------------------------------

def bench_gemlite(shapes, ms, gen, deadline, mode: str, log) -> dict:
    """gemlite A16W4_MXFP from the same kind of bf16 weight, rotated over > 4x L2 like the others."""
    timer = _timer()
    out: dict = {}
    try:
        import gemlite
        import gemlite.helper
        out["version"] = getattr(gemlite, "__version__", "?")
        try:
            gemlite.set_autotune(mode)
            out["autotune"] = mode
        except Exception as e:  # noqa: BLE001 - older / newer API: keep its default
            out["autotune"] = f"library default (set_autotune({mode!r}) failed: {type(e).__name__})"
        cache = Path(gemlite.__file__).parent / "configs" / "h100.json"
        if cache.exists():
            gemlite.core.GemLiteLinearTriton.load_config(str(cache))
    except Exception as e:  # noqa: BLE001
        return {"error": f"not available: {type(e).__name__}: {str(e)[:200]}"}
    rows = []
    for N, K in shapes:
        if time.monotonic() > deadline:
            break
        try:
            w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            mods = []
            for _ in range(_copies(N * K // 2)):
                lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    lin.weight.copy_(w)
                mods.append(gemlite.helper.A16W4_MXFP(device="cuda", dtype=torch.bfloat16).from_linear(lin))
        except Exception as e:  # noqa: BLE001
            rows.append({"N": N, "K": K, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        for M in ms:
            if time.monotonic() > deadline:
                rows.append({"N": N, "K": K, "M": M, "skipped": "budget spent"})
                continue
            t0 = time.monotonic()
            try:
                x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
                err = _err(mods[0](x).float(), x.float() @ w.float().T)  # incl. its own quantization error
                us = timer([lambda m=m, x=x: m(x) for m in mods])
                rows.append({"N": N, "K": K, "M": M, "us": us, "err_vs_bf16": err, "s": time.monotonic() - t0})
            except Exception as e:  # noqa: BLE001
                rows.append({"N": N, "K": K, "M": M, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            log(f"gemlite A16W4_MXFP {N}x{K} M={M}: {rows[-1].get('us', rows[-1].get('error'))} "
                f"({time.monotonic() - t0:.0f}s)")
        del mods
        torch.cuda.empty_cache()
    out["A16W4_MXFP"] = rows
    return out


# --- summary, table -----------------------------------------------------------------------------------------------

def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        for k in ("kgemm_x_bf16", "kgemm_x_route", "stored_x_bf16"):
            if r.get(k):
                out.setdefault(r["format"], {}).setdefault(str(r["M"]), {}).setdefault(k, []).append(r[k])
    return {f: {m: {k: {"min": min(v), "median": statistics.median(v), "shapes": len(v)} for k, v in d.items()}
                for m, d in fd.items()} for f, fd in out.items()}


def suggest_rows(rows: list[dict], ms: list[int]) -> dict:
    """Per format, the widest run of measured row counts (from 2) where kgemm beats both bf16 and the current
    route by WIN on every shape measured: [lo, hi] for KGEMM_ROWS, or absent."""
    out = {}
    for fmt in {r["format"] for r in rows}:
        good = []
        for M in ms:
            rs = [r for r in rows if r["format"] == fmt and r.get("M") == M]
            ok = bool(rs) and all(r.get("kgemm_x_bf16", 0) >= WIN and r.get("kgemm_x_route", 0) >= WIN for r in rs)
            good.append((M, ok))
        best, cur = None, None
        for M, ok in good:
            if M < 2:
                continue
            if ok:
                cur = (cur[0], M) if cur else (M, M)
                if best is None or _span(cur, ms) > _span(best, ms):
                    best = cur
            else:
                cur = None
        if best:
            out[fmt] = list(best)
    return out


def _span(r, ms):
    return ms.index(r[1]) - ms.index(r[0])


def kgemm_section(rows: list[dict]) -> dict:
    """{"fmt,N,K,M": best config} for the row buckets measured (tuned.GEMM_M_BUCKETS)."""
    from synodic.kernels.quant_linear import tuned as tuned_mod
    out = {}
    for r in rows:
        if r.get("kgemm_config") and r["M"] in tuned_mod.GEMM_M_BUCKETS:
            out[tuned_mod.key(r["format"], r["N"], r["K"], r["M"])] = r["kgemm_config"]
    return dict(sorted(out.items()))


def apply_section(result: Path, table: Path | None) -> None:
    """Merges a result's "kgemm_section" into the GPU's tuned table (other sections and keys kept)."""
    from synodic.kernels.quant_linear import tuned as tuned_mod
    doc = json.loads(result.read_text())
    path = table or tuned_mod.table_path(doc["gpu"])
    data = json.loads(path.read_text()) if path.exists() else {"meta": {"runs": []}, "configs": {}}
    data.setdefault("meta", {}).setdefault("runs", []).append({k: doc[k] for k in ("gpu", "date", "command")})
    data["kgemm"] = dict(sorted({**data.get("kgemm", {}), **doc["kgemm_section"]}.items()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    print(f"{path}: {len(doc['kgemm_section'])} kgemm entries merged")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kgemm", action="store_true", help="(the flag quant_gemm passes this mode on with)")
    ap.add_argument("--out", type=out_file, default="kgemm.json")
    ap.add_argument("--budget", type=float, default=210.0, help="seconds from the start for everything")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--no-libs", action="store_true")
    ap.add_argument("--gemlite-autotune", default="default", help="gemlite.set_autotune mode (default: no "
                    "autotune, its default configs; 'fast' autotunes ~20 s a row count)")
    ap.add_argument("--gemlite-shapes", type=int, default=2, help="how many of the shapes gemlite runs on")
    ap.add_argument("--libs-path", default=".whl/site")
    a = ap.parse_args(argv)
    start = time.monotonic()
    log = lambda m: print(f"[{time.monotonic() - start:5.0f}s] {m}", flush=True)  # noqa: E731
    try:
        ms = [int(m) for m in a.ms.split(",")]
        shapes = _pairs(a.shapes)
    except ValueError as e:
        print(f"quant_gemm --kgemm: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    formats = a.formats.split(",")
    bad = [f for f in formats if f not in ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")]
    if bad:
        print(f"quant_gemm --kgemm: --formats {bad[0]!r}: expected mxfp4, nvfp4, mxfp8_e4m3 or mxfp8_e5m2",
              file=sys.stderr)
        raise SystemExit(2)
    if not torch.cuda.is_available():
        raise SystemExit("quant_gemm --kgemm needs a CUDA GPU (the kernel's CPU checks are the tests)")
    if os.path.isdir(a.libs_path):
        sys.path.insert(0, os.path.abspath(a.libs_path))
        os.environ["PYTHONPATH"] = os.path.abspath(a.libs_path) + os.pathsep + os.environ.get("PYTHONPATH", "")
    import triton
    name = torch.cuda.get_device_name(0)
    doc = {"gpu": name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "command": "python -m benchmarks.quant_gemm " + " ".join(sys.argv[1:] if argv is None else argv),
           "shapes": shapes, "ms": ms, "formats": formats,
           "notes": ["us per call in a CUDA graph over weight copies > 4x L2 (HBM reads); x_bf16 = bf16 us / us",
                     "stored: the stored-layout kernels' default (gemvh / dotp), what a layer runs up to "
                     "KERNEL_MAX_ROWS; route: what a layer with a dense copy runs today (stored or bf16)",
                     "kgemm: the best of the candidates (all in kgemm_tried), each checked against the reference",
                     "W4A16 / W8A16 with the DualQuant input-channel multiplier s fused; bf16 activations"],
           "bench": []}

    def save():
        doc["summary"] = summary(doc["bench"])
        doc["suggest_kgemm_rows"] = suggest_rows(doc["bench"], ms)
        doc["kgemm_section"] = kgemm_section(doc["bench"])
        doc["elapsed_s"] = time.monotonic() - start
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")

    if not a.no_precompile:
        doc["precompile"] = precompile(shapes, formats, ms, a.workers, log)
    gen = torch.Generator(device="cuda").manual_seed(0)
    lib_reserve = 0 if a.no_libs else 40
    for N, K in shapes:
        doc["bench"] += bench_shape(N, K, ms, formats, gen, start + a.budget - lib_reserve, log)
        save()
    if not a.no_libs:
        doc["gemlite"] = bench_gemlite(shapes[:a.gemlite_shapes], [m for m in GEMLITE_MS if m in ms] or GEMLITE_MS,
                                       gen, start + a.budget, a.gemlite_autotune, log)
    save()
    for f, d in doc["summary"].items():
        log(f"{f}: kgemm x bf16 (min / median over shapes) " + ", ".join(
            f"M={m} {v['kgemm_x_bf16']['min']:.2f}/{v['kgemm_x_bf16']['median']:.2f}" for m, v in d.items()
            if "kgemm_x_bf16" in v))
        log(f"{f}: kgemm x current route (min / median) " + ", ".join(
            f"M={m} {v['kgemm_x_route']['min']:.2f}/{v['kgemm_x_route']['median']:.2f}" for m, v in d.items()
            if "kgemm_x_route" in v))
    log(f"suggest_kgemm_rows (KGEMM_ROWS): {doc['suggest_kgemm_rows']}")
    log(f"wrote {a.out} ({doc['elapsed_s']:.0f}s)")


if __name__ == "__main__":
    main()
