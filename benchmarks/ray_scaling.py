"""CPU replica scaling of runtime=ray: the same greedy request stream served by runtime=local (one CPU thread)
and by 1..N Ray CPU replicas (one CPU each), through `run.py`, the results.json of each run read back.

    python -m benchmarks.ray_scaling --replicas 1 2 --out ray_scaling.json

Throughput = output tokens / wall time of the serve (prefill included: what a client sees), and the summed
decode rate of the replicas; scaling = throughput over the one-replica run's. The machine must have the CPUs:
each replica is a process with one torch thread."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._cli import compose_or_exit, out_file, positive_int

ROOT = Path(__file__).resolve().parents[1]


def serve(over: list[str], threads: int = 1) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, str(ROOT / "run.py"), *over, f"hydra.run.dir={d}"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if p.returncode:
            # run.py's exit 2 is bad input with one `error:` line per problem: quote those and keep the 2
            errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
            why = "; ".join(errors) if p.returncode == 2 and errors else p.stderr.strip()[-400:]
            print(f"{' '.join(over)}: exit {p.returncode}: {why}", file=sys.stderr)
            raise SystemExit(2 if p.returncode == 2 else 1)
        res = json.loads((Path(d) / "results.json").read_text())
    m = res["metrics"]
    return {"overrides": over, "output_tokens": m["output_tokens"], "wall_s": m["wall_s"],
            "tokens_per_s_wall": m["output_tokens"] / m["wall_s"], "decode_tokens_per_s": m["decode_tokens_per_s"],
            "replicas": [{k: r.get(k) for k in ("requests", "decode_tokens_per_s")} for r in res.get("replicas") or []]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny_mamba2")
    ap.add_argument("--replicas", nargs="+", type=positive_int, default=[1, 2])
    ap.add_argument("--requests", type=positive_int, default=32)
    ap.add_argument("--tokens", type=positive_int, default=48)
    ap.add_argument("--out", type=out_file, default=Path("ray_scaling.json"))
    a = ap.parse_args(argv)
    compose_or_exit(ap, [f"model={a.model}"], {"model": "--model"})
    base = [f"model={a.model}", "runtime.device=cpu", "workload=chat", f"workload.num_requests={a.requests}",
            "workload.prompt_len=32", f"workload.output_len={a.tokens}", "workload.concurrency=8"]
    rows = [{"runtime": "local", **serve(base)}]
    for n in a.replicas:
        rows.append({"runtime": f"ray x{n}", **serve([*base, "runtime=ray", f"runtime.replicas={n}",
                                                      "runtime.cpus_per_replica=1"])})
    one = next((r for r in rows if r["runtime"] == "ray x1"), rows[0])
    for r in rows:
        r["scaling_vs_one_replica"] = r["tokens_per_s_wall"] / one["tokens_per_s_wall"]
        print(f"{r['runtime']:8s} {r['tokens_per_s_wall']:8.1f} tok/s (wall)  decode {r['decode_tokens_per_s']:8.1f}"
              f"  x{r['scaling_vs_one_replica']:.2f}", flush=True)
    a.out.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
