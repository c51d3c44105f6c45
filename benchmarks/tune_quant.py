"""Tunes the packed kernels' launch configs on a preset's own linear shapes and writes this GPU's table
(`quant_linear/tuned.py` reads it).

    python -m benchmarks.tune_quant [--models nemotron_h_8b] [--formats mxfp4,nvfp4,mxfp8_e4m3]
        [--ms 1,2,4,16] [--out kernels/quant_linear/tuned/<GPU>.json] [--budget 600]

Per (format, N, K, M): the heuristic's config (`launch.resolve_config`, never the table) and candidates
around it (its K split halved, doubled, quadrupled; for M >= 3 the format's other dotp tiles with their own
split), every one checked against the torch reference first (rel. RMSE <= 2e-2) and timed as `bench_quant`
times (one CUDA graph of calls cycling over weight copies > 4x L2). The three fastest are timed twice more in
alternating order; a candidate enters the table only if its median beats the heuristic's median by
MIN_GAIN, so timing noise leaves the heuristic in place. Shapes go heaviest first (count x N x K over the
models); the table file is rewritten (atomically) after every shape, so a run cut short keeps what it measured,
and an existing table's entries for other keys are kept (its "meta" lists every run: GPU, date, versions,
command).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._cli import out_file

MIN_GAIN = 0.03  # a candidate must beat the heuristic's median time by this fraction
RETIME = 3  # candidates (the heuristic among them) timed twice more
CHECK_TOL = 2e-2


def model_shapes(preset: str, fmt: str) -> dict[tuple[int, int], int]:
    """{(N, K): how many} of the linears `quant=<fmt>` quantizes in a preset (default layer patterns), built on the
    meta device: no weights, no memory."""
    from synodic.models.lm import HybridLM
    from synodic.models.presets import PRESETS
    from synodic.quant.apply import select_linears
    from synodic.quant.config import BlockQuant

    if preset not in PRESETS:
        raise ValueError(f"--models {preset!r}: expected one of {', '.join(sorted(PRESETS))}")
    with torch.device("meta"):
        model = HybridLM(PRESETS[preset])
    names, _ = select_linears(model, list(BlockQuant.model_fields["layers"].default), fmt)
    mods = dict(model.named_modules())
    count: dict[tuple[int, int], int] = {}
    for n in names:
        nk = (mods[n].out_features, mods[n].in_features)
        count[nk] = count.get(nk, 0) + 1
    return count


def candidates(M: int, N: int, K: int, fmt: str, sms: int) -> list[dict]:
    """The heuristic's config first, then distinct alternatives (full configs, SPLIT_K included)."""
    from synodic.kernels.quant_linear.launch import _DOTP, resolve_config

    base = resolve_config(M, N, K, fmt, None, sms)
    out = [base]
    for f in (0.5, 2, 4):
        split = int(base["SPLIT_K"] * f)
        if 1 <= split <= 64:
            out.append(dict(base, SPLIT_K=split))
    if base["KERNEL"] == "dotp":
        for bn, bk, st in dict.fromkeys(e[1] for e in _DOTP[fmt]):
            tile = resolve_config(M, N, K, fmt, dict(KERNEL="dotp", BLOCK_N=bn, BLOCK_K=bk, num_warps=4,
                                                      num_stages=st), sms)
            out.append(tile)
    return unique_configs(out)



def unique_configs(configs: list[dict]) -> list[dict]:
    """configs without repeats, first occurrence kept (the heuristic's config leads every candidate list)."""
    return list({json.dumps(c, sort_keys=True): c for c in configs}.values())


def choose(times: dict[int, list[float]]) -> int:
    """Index of the candidate to keep: the lowest median, if it beats candidate 0 (the heuristic) by MIN_GAIN,
    else 0."""
    med = {i: statistics.median(t) for i, t in times.items()}
    best = min(med, key=med.get)
    return best if med[best] <= (1 - MIN_GAIN) * med[0] else 0


def _write(path: Path, meta: dict, configs: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {"meta": meta, "configs": dict(sorted(configs.items()))}
    if path.exists() and "gemm" in (old := json.loads(path.read_text())):  # the packed GEMM's section (quant_gemm)
        data["gemm"] = old["gemm"]
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def tune(shapes: list[tuple[str, int, int]], ms: list[int], path: Path, meta: dict, *, device, time_fn,
         budget: float = float("inf"), log=print) -> dict:
    """Tunes each (format, N, K) of `shapes` at each row count of `ms` (table buckets), in order, and rewrites the
    table at `path` after each shape. time_fn(fns, calls) -> us per call (`synodic.kernels.timing.graph_us` on a GPU).
    Returns the table's configs."""
    from synodic.kernels.quant_linear import quant_linear
    from synodic.kernels.quant_linear import tuned as tuned_mod
    from synodic.kernels.quant_linear.launch import _sms

    from benchmarks.quant_linear import _copies
    from synodic.quant import quantize

    bad = [m for m in ms if m not in tuned_mod.M_BUCKETS]
    if bad:
        raise ValueError(f"--ms {bad[0]}: expected row counts among the table's buckets {tuned_mod.M_BUCKETS}")
    configs = dict(tuned_mod.load.__wrapped__(path)) if path.exists() else {}
    # one meta record per run: a table merged over runs says which run measured what
    runs = json.loads(path.read_text())["meta"]["runs"] if path.exists() else []
    meta = {"runs": [*runs, meta]}
    sms = _sms(device)
    gen = torch.Generator(device=device).manual_seed(0)
    t0 = time.time()
    for i, (fmt, N, K) in enumerate(shapes):
        if time.time() - t0 > budget:
            log(f"budget spent: {len(shapes) - i} shapes left untuned")
            break
        w = torch.randn(N, K, device=device, generator=gen) * 0.02
        q = quantize(w, fmt)
        del w
        qs = [q] + [type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                            None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
                    for _ in range(_copies(q.nbytes()) - 1)]
        calls = max(24, len(qs))
        for M in ms:
            x = torch.randn(M, K, device=device, generator=gen).to(torch.bfloat16)
            ref = quant_linear(x, q, backend="ref").float()

            def timed(cfg, x=x, qs=qs, calls=calls):
                return time_fn([lambda qc=qc: quant_linear(x, qc, backend="triton", config=cfg) for qc in qs], calls)

            cands, times = [], {}
            for cfg in candidates(M, N, K, fmt, sms):
                y = quant_linear(x, q, backend="triton", config=cfg).float()
                if not ((y - ref).norm() / ref.norm()).item() <= CHECK_TOL:
                    if not cands:
                        raise RuntimeError(f"{fmt} {N}x{K} M={M}: the heuristic config {cfg} fails the reference")
                    continue
                times[len(cands)] = [timed(cfg)]
                cands.append(cfg)
            top = sorted(times, key=lambda j: times[j][0])[:RETIME]
            top = top if 0 in top else top[:RETIME - 1] + [0]
            for _ in range(2):  # alternating, so drift during the run hits every candidate alike
                for j in top:
                    times[j].append(timed(cands[j]))
            kept = choose({j: times[j] for j in top})
            k = tuned_mod.key(fmt, N, K, M)
            if kept:
                configs[k] = cands[kept]
            else:
                configs.pop(k, None)
            c = cands[kept]
            log(f"[{i + 1}/{len(shapes)} {time.time() - t0:.0f}s] {fmt} {N}x{K} M={M}: heuristic "
                f"{statistics.median(times[0]):.1f} us; " + (
                    f"kept {c['KERNEL']} [{c['BLOCK_N']}x{c['BLOCK_K']}] split {c['SPLIT_K']} "
                    f"{statistics.median(times[kept]):.1f} us" if kept else "heuristic kept"))
        del qs, q
        _write(path, meta, configs)
    return configs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="nemotron_h_8b")
    ap.add_argument("--formats", default="mxfp4,nvfp4,mxfp8_e4m3")
    ap.add_argument("--ms", default="1,2,4,16")
    ap.add_argument("--out", type=out_file, default=None,
                    help="table file (default: this GPU's file under quant_linear/tuned/)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds; shapes left when it runs out are skipped")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune_quant: needs a CUDA GPU (it times kernels)")
    import triton
    from synodic.kernels.quant_linear import tuned as tuned_mod
    from synodic.kernels.timing import graph_us

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    path = Path(args.out) if args.out else tuned_mod.table_path(name)
    meta = {"gpu": name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": triton.__version__, "models": args.models,
            "command": "python -m benchmarks.tune_quant " + " ".join(sys.argv[1:] if argv is None else argv)}
    # the shapes that hold the most weight bytes first (a run cut short by the budget has tuned those)
    weight: dict[tuple[str, int, int], int] = {}
    for m in args.models.split(","):
        for fmt in args.formats.split(","):
            for (n, k), c in model_shapes(m, fmt).items():
                weight[(fmt, n, k)] = weight.get((fmt, n, k), 0) + c * n * k
    shapes = sorted(weight, key=lambda s: (-weight[s], s))
    try:
        configs = tune(shapes, [int(m) for m in args.ms.split(",")], path, meta, device=dev,
                       time_fn=graph_us, budget=args.budget, log=lambda s: print(s, flush=True))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(f"wrote {path} ({len(configs)} entries)")


if __name__ == "__main__":
    main()
