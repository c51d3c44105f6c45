"""What a speculative engine's plain steps cost against a plain engine's: the same rounds as
benchmarks.spec_decode, with the drafter's gate held shut (it never drafts, not even to probe), beside spec=none
and the scheme with every step drafting. Host time per step of the plain loop's engine functions is recorded too.

    python -m benchmarks.closed_gate --out closed_gate.json [--models tiny_gdn] [--batches 1 32]"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks._cli import compose_or_exit, out_file, positive_int
from benchmarks.spec_decode import GPU, SMOKE, Variant, heldout_prompts, variant_overrides
from synodic.spec.gate import MeasuredGate


class ShutGate(MeasuredGate):
    """A gate that never opens and never probes."""

    def open(self, b: int) -> bool:
        return False

    def drafts(self, b: int) -> bool:
        return False

    def feeds(self) -> bool:
        return False


HOST = ("_finish", "_launch", "_plain_ring", "_speculates", "_chain_rows")


def _timed(f, name: str, host: dict):
    def timed(self, *args, **kw):
        t = time.perf_counter()
        try:
            return f(self, *args, **kw)
        finally:
            host[name] = host.get(name, 0.0) + time.perf_counter() - t
    return timed


def main(argv=None) -> None:
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.text import load_codec
    from synodic.graph import checkpoint_dir
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default=Path("closed_gate.json"))
    ap.add_argument("--models", nargs="+", default=["tiny_mamba2", "tiny_gdn"])
    ap.add_argument("--batches", nargs="+", type=positive_int, default=[1, 32])
    ap.add_argument("--schemes", nargs="+", default=["dspark", "dflash2"])
    ap.add_argument("--repeats", type=positive_int, default=3)
    a = ap.parse_args(argv)
    p = dict(GPU if torch.cuda.is_available() else SMOKE)
    for model in a.models:  # every variant's config before the first engine is built
        for s in ["none", *a.schemes]:
            compose_or_exit(ap, variant_overrides(model, s, max(a.batches), p),
                            {"model": "--models", "spec": "--schemes"})
    host: dict[str, float] = {}
    for name in HOST:  # host seconds spent in each engine function
        setattr(Engine, name, _timed(getattr(Engine, name), name, host))
    rows = []
    for model in a.models:
        prompts = heldout_prompts(load_codec(checkpoint_dir(compose([f"model={model}"]).model)), 64,
                                  p["prompt_tokens"])
        for batch in a.batches:
            specs = ["none"] + [f"{s} {g}" for s in a.schemes for g in ("spec.gate=auto", "spec.gate=off")]
            vs = []
            for spec in specs:
                v = Variant(model, spec, batch, p, prompts)
                if spec.endswith("gate=auto"):
                    v.eng.drafter.gate = ShutGate()  # (after the warm-up round: its graphs are captured)
                vs.append(v)
            last, drafted = {}, {}
            for _ in range(a.repeats):
                for v in vs:
                    host.clear()
                    r = v.measure()
                    last[v.spec] = {k: round(1e3 * t / max(r["steps"], 1), 4) for k, t in host.items()}
                    drafted[v.spec] = r.get("spec_steps", 0) - r.get("plain_steps", 0)
            base = statistics.median(vs[0].rates)
            for v in vs:
                rate = statistics.median(v.rates)
                label = v.spec.replace("spec.gate=auto", "gate shut")
                rows.append({"model": model, "batch": batch, "variant": label, "decode_tokens_per_s": rate,
                             "vs_plain": rate / base, "drafting_steps": drafted[v.spec],
                             "host_ms_per_step": last[v.spec]})
                print(f"{model:12s} b={batch:<4d} {label:24s} {rate:10.1f} tok/s x{rate / base:.2f}", flush=True)
            del vs
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            a.out.write_text(json.dumps({"params": p, "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
