"""The speculative-decoding targets' runs that BENCHMARKS.md cites (S3, S4, S5), as one list run in turn: each is
the exact command of its section, given its share of a time budget, its output kept under --out (a log per run,
plus the run directories and JSON they write).

    python -m benchmarks.spec_targets --out runs/targets                   # every run, GPU
    python -m benchmarks.spec_targets --only headline s5 --budget-s 540    # some of them
    python -m benchmarks.spec_targets --check                              # compose every run's config (CPU)

Runs (H200 sizes; an 80 GB card takes 128 rows where the H200 takes 256, where batch 256 does not fit):
- headline: S4, the headline command against plain decoding at batch 1 / 32, γ = 7, forced at the drafters'
  measured rates, the gate on and off;
- headline256: S4 at batch 256;
- s3_nemotron, s3_gdn: S3, replay against eager SSM state under speculation (γ = 3, every step drafting) at the
  measured rates, batch 256;
- s5: S5, load-aware DSpark and gated dflash2 against plain decoding on the embedded models, batch 1 / 32 / 256."""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._cli import positive_float

H = "ssm=replay kv=adaptive quant=nvfp4"
S = "spec=dflash2 spec.drafter=random"
S3 = f"{S} spec.num_speculative_tokens=3 spec.gate=off"
FORCED = ["pipeline.acceptance=forced", "pipeline.repeats=1"]


def _bench(model: str, rows: int, blocks: int, batches: list[int], variants: list[str], steps: int, warmup: int):
    vs = ", ".join(repr(v) for v in variants)
    return ["run.py", "pipeline=bench", f"model={model}", f"runtime.max_slots={rows}", f"kv.num_blocks={blocks}",
            f"pipeline.batch_sizes=[{','.join(map(str, batches))}]", f"pipeline.variants=[{vs}]", *FORCED,
            f"pipeline.steps={steps}", f"pipeline.warmup={warmup}"]


def runs(big: bool) -> dict[str, list[str]]:
    """name → argv (after `python`); `big`: the card holds batch 256 of the 8B preset (an H200)."""
    b = 256 if big else 128
    return {
        "headline": _bench("nemotron_h_8b", 32, 2048, [1, 32], ["", f"{H} {S}", f"{H} {S} spec.gate=off"], 64, 16),
        "headline256": _bench("nemotron_h_8b", b, 12288 if big else 4096, [b],
                              ["", f"{H} {S}", f"{H} {S} spec.gate=off"], 48, 16),
        "s3_nemotron": _bench("nemotron_h_8b", b, 8192, [b], ["", "ssm=replay", f"ssm=replay {S3}", S3], 16, 6),
        "s3_gdn": _bench("qwen35_gdn_4b", b, 4096, [b], ["", "ssm=replay", f"ssm=replay {S3}", S3], 16, 6),
        "s5": ["-m", "benchmarks.spec_decode", "--batches", "1", "32", "256", "--repeats", "3", "--specs", "none",
               "dspark spec.verify=load_aware", "dflash2", "dflash2 spec.gate=off"],
    }


def shown(argv: list[str]) -> str:
    """A command line to paste into bash: an argument holding single quotes (the variants) in double quotes."""
    def one(x: str) -> str:
        if "'" in x and not any(c in x for c in '"$`\\!'):
            return f'"{x}"'
        return shlex.quote(x)
    return " ".join(one(x) for x in argv)


def check(argv: list[str]) -> list[str]:
    """The problems composing a run's configs (its own and each bench variant's), one line each."""
    from synodic.config.errors import ConfigError
    from synodic.config.hydra_errors import compose_checked
    if argv[0] != "run.py":
        from benchmarks.spec_decode import variant_overrides
        specs = argv[argv.index("--specs") + 1:]
        out = []
        for s in specs:
            for m in ("tiny_mamba2", "tiny_gdn"):
                try:
                    compose_checked(variant_overrides(m, s, 1, {"ssm": "replay", "device": "cpu"}))
                except ConfigError as e:
                    out += [f"--specs {s!r}: {line}" for line in e.lines]
        return out
    over = argv[1:]
    try:
        cfg = compose_checked(over)
    except ConfigError as e:
        return e.lines
    base = [o for o in over if not o.startswith("pipeline.variants=")]
    out = []
    for v in cfg.pipeline.variants:
        try:
            compose_checked(base + v.split())
        except ConfigError as e:
            out += [f"variant {v!r}: {line}" for line in e.lines]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = list(runs(True))
    ap.add_argument("--out", type=Path, default=Path("runs/targets"), help="folder for the logs and run folders")
    ap.add_argument("--only", nargs="+", choices=names, help="these runs, in this order (default: all)")
    ap.add_argument("--budget-s", type=positive_float, default=3000.0, help="seconds for all the runs together; "
                    "each gets an equal share of what is left when it starts")
    ap.add_argument("--check", action="store_true", help="compose every run's config and print the commands; "
                    "run nothing")
    a = ap.parse_args(argv)
    chosen = a.only or names
    if a.check:
        bad = {n: check(runs(True)[n]) for n in chosen}
        for n in chosen:
            print(f"{n}: python {shown(runs(True)[n])}")
            for line in bad[n]:
                print(f"  problem: {line}")
        if any(bad.values()):
            sys.exit(2)
        return
    import torch
    if not torch.cuda.is_available():
        ap.error("the target runs need a CUDA GPU; expected --check on a machine without one")
    big = torch.cuda.get_device_properties(0).total_memory > 100 * 2**30
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"argument --out: invalid value {str(a.out)!r}; expected a folder")
    a.out.mkdir(parents=True, exist_ok=True)
    t0, done = time.monotonic(), {}
    for i, n in enumerate(chosen):
        argv_n = runs(big)[n]
        share = (a.budget_s - (time.monotonic() - t0)) / (len(chosen) - i)
        if argv_n[0] == "run.py":
            argv_n = [*argv_n, f"hydra.run.dir={a.out / n}"]
        else:
            argv_n = [*argv_n, "--out", str(a.out / f"{n}.json")]
        print(f"[{n}] python {shown(argv_n)}  (up to {share:.0f} s)", flush=True)
        with open(a.out / f"{n}.log", "w") as log:
            t = time.monotonic()
            try:
                rc = subprocess.run([sys.executable, *argv_n], stdout=log, stderr=subprocess.STDOUT,
                                    timeout=max(share, 1.0)).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        done[n] = {"rc": rc, "seconds": round(time.monotonic() - t, 1), "argv": argv_n}
        print(f"[{n}] {'ok' if rc == 0 else rc} in {done[n]['seconds']} s; log {a.out / f'{n}.log'}", flush=True)
    (a.out / "targets.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "runs": done}, indent=1))


if __name__ == "__main__":
    main()
