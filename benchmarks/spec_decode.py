"""Speculative decoding against plain decoding through the engine: decode tokens/s per (model, batch, spec),
the acceptance it ran at, and a check that every variant's greedy output equals plain decoding's.

    python -m benchmarks.spec_decode --out spec_decode.json                 # GPU: embedded models, CUDA graphs
    python -m benchmarks.spec_decode --smoke --out smoke.json               # CPU: seconds

Prompts are cut from the held-out corpus (the drafters were trained on the training split), so the shipped
drafters accept what they would on real text of this kind. Every (model, batch, spec) builds its engine once,
serves a warm-up round (kernel compilation, one CUDA graph per batch bucket); then the variants of one (model,
batch) take `repeats` measured rounds of the same shape in turn, and a variant's decode tokens/s is the median
over its rounds of tokens produced by decode steps / decode wall time (capture excluded). The speedup of a
variant is its rate over plain decoding's at the same model and batch, in the same process (`speedup_vs_none`:
the ratio of the medians), and `speedup_paired` the median of the per-round ratios (round k against plain
decoding's round k, taken next to each other), which drift between rounds moves less."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks._cli import compose_or_exit, out_file, positive_int

GPU = dict(models=["tiny_mamba2", "tiny_gdn"], batches=[1, 32], specs=["none", "ngram", "dflash2"],
           ssm="replay", prompt_tokens=64, output_tokens=96, rounds_per_batch=2, min_round_requests=8, repeats=5,
           device="cuda")
SMOKE = dict(models=["tiny_mamba2"], batches=[2], specs=["none", "dflash2"], ssm="replay", prompt_tokens=16,
             output_tokens=8, rounds_per_batch=1, repeats=1, device="cpu")


def heldout_prompts(codec, n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `tokens` tokens from evenly spaced offsets of the held-out corpus."""
    from synodic.engine.workload import ASSETS
    ids = codec.encode((ASSETS / "corpus" / "heldout.txt").read_text()[:400_000])
    step = max(1, (len(ids) - tokens) // max(n, 1))
    g = torch.Generator().manual_seed(seed)
    jitter = torch.randint(0, max(1, step // 2), (n,), generator=g).tolist()
    return [ids[i * step + j: i * step + j + tokens] for i, j in enumerate(jitter)]


def variant_overrides(model: str, spec: str, batch: int, p: dict) -> list[str]:
    kind, *extra = spec.split()  # "dflash2 spec.dtype=bfloat16": a scheme and its overrides
    return [f"model={model}", f"ssm={p['ssm']}", f"spec={kind}", *extra, f"runtime.device={p['device']}",
            f"runtime.max_slots={max(batch, 1)}"]


class Variant:
    """One (model, spec, batch) engine, warmed up: `measure()` serves one measured round and returns its row."""

    def __init__(self, model: str, spec: str, batch: int, p: dict, prompts):
        from synodic.config.compose import compose
        from synodic.engine.engine import Engine
        from synodic.graph import build_graph
        over = variant_overrides(model, spec, batch, p)
        self.model, self.spec, self.batch, self.p, self.prompts = model, spec, batch, p, prompts
        self.eng = Engine(build_graph(compose(over), max_seq_len=p["prompt_tokens"] + p["output_tokens"] + 16))
        self.rates: list[float] = []
        self._round()  # warm-up: compilation, one graph per bucket

    def _round(self):
        from synodic.engine.request import Request, SamplingParams
        # at least min_round_requests a round: a round of one or two requests is short enough that a clock ramp
        # or a gate's probe decides its rate (docs/measuring.md)
        n = max(self.batch * self.p["rounds_per_batch"], self.p.get("min_round_requests", 1))
        reqs = [Request(i, list(pr), SamplingParams(max_tokens=self.p["output_tokens"]))
                for i, pr in enumerate(self.prompts[:n])]
        self.eng.generate(reqs)
        return reqs

    def measure(self) -> dict:
        eng = self.eng
        eng.ledger.__init__()
        eng.spec_stats.__init__()
        eng.decode_s = 0.0
        t0 = time.perf_counter()
        reqs = self._round()
        wall = time.perf_counter() - t0
        rate = eng.ledger.tokens / eng.decode_s if eng.decode_s else 0.0
        self.rates.append(rate)
        out = {"model": self.model, "spec": self.spec, "ssm": self.p["ssm"], "batch": self.batch,
               "requests": len(reqs), "decode_tokens": eng.ledger.tokens, "decode_s": eng.decode_s, "wall_s": wall,
               "decode_tokens_per_s": statistics.median(self.rates), "rounds": len(self.rates),
               "rates": [round(r, 1) for r in self.rates], "steps": eng.ledger.steps,
               "cuda_graphs": bool(eng.runner.graphs), "outputs": [r.output_ids for r in reqs]}
        if eng.drafter is not None:
            s = eng.spec_stats.summary()
            out.update(mean_acceptance_length=s["mean_acceptance_length"], acceptance_rate=s["acceptance_rate"],
                       acceptance_rate_by_position=s["acceptance_rate_by_position"], spec_steps=s["steps"],
                       plain_steps=s["plain_steps"])
            gate = eng.drafter.summary().get("gate")
            if gate is not None:  # the drafter's gate after this round (its counts accumulate over rounds)
                out["gate"] = gate
        return out


def measure_batch(model: str, batch: int, p: dict, prompts) -> list[dict]:
    """Every spec variant at one (model, batch): all engines built and warmed up first, then `repeats` measured
    rounds taken in turn (variant 1, 2, .., 1, 2, ..), so clock and host drift fall on every variant alike; a
    variant's rate is the median of its rounds."""
    variants = [Variant(model, spec, batch, p, prompts) for spec in p["specs"]]
    rows = {}
    for _ in range(p["repeats"]):
        for v in variants:
            rows[v.spec] = v.measure()
    out = [rows[v.spec] for v in variants]
    del variants
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the engines are gone: their pools go back to the device
    base = next((r for r in out if r["spec"] == "none"), None)
    for r in out:
        r["speedup_vs_none"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"] if base else None
        # round k of a variant over round k of plain decoding, taken next to each other: a drift of the clocks or
        # the host between rounds falls on both sides of each ratio, not on one median
        paired = [v / b for v, b in zip(r["rates"], base["rates"]) if b > 0] if base else []
        r["speedup_by_round"] = [round(x, 3) for x in paired]
        r["speedup_paired"] = statistics.median(paired) if paired else None
        r["greedy_equals_none"] = r["outputs"] == base["outputs"] if base else None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default=Path("spec_decode.json"))
    ap.add_argument("--smoke", action="store_true", help="CPU sizes (automatic without a CUDA device)")
    ap.add_argument("--models", nargs="+")
    ap.add_argument("--batches", nargs="+", type=positive_int)
    ap.add_argument("--specs", nargs="+", help="spec options, each optionally with its overrides in one "
                    "quoted word: 'dflash2 spec.dtype=bfloat16'")
    ap.add_argument("--ssm")
    ap.add_argument("--repeats", type=positive_int, help="measured rounds per variant, interleaved across variants")
    a = ap.parse_args(argv)
    p = dict(SMOKE if a.smoke or not torch.cuda.is_available() else GPU)
    for k in ("models", "batches", "specs", "ssm", "repeats"):
        if getattr(a, k):
            p[k] = getattr(a, k)
    # every variant's config before the first engine is built: a bad name fails in a second, not after a model's rows
    for model in p["models"]:
        for spec in p["specs"]:
            compose_or_exit(ap, variant_overrides(model, spec, max(p["batches"]), p),
                            {"model": "--models", "spec": "--specs", "ssm": "--ssm"})
    from synodic.config.compose import compose
    from synodic.engine.text import load_codec
    from synodic.graph import checkpoint_dir
    rows = []
    for model in p["models"]:
        codec = load_codec(checkpoint_dir(compose([f"model={model}"]).model))
        # at least 64 prompts: their spacing over the corpus depends on the count, so a run of batch 1 alone
        # serves the same first prompts as a run of batches 1 and 32
        prompts = heldout_prompts(codec, max(64, max(p["batches"]) * p["rounds_per_batch"]), p["prompt_tokens"])
        for batch in p["batches"]:
            for r in measure_batch(model, batch, p, prompts):
                rows.append(r)
                print(f"{model:12s} b={batch:<4d} spec={r['spec']:8s} {r['decode_tokens_per_s']:10.1f} tok/s "
                      f"x{r['speedup_vs_none'] or 0:.2f} (paired x{r['speedup_paired'] or 0:.2f})  "
                      f"accept={r.get('mean_acceptance_length')}  "
                      f"lossless={r['greedy_equals_none']}", flush=True)
            a.out.write_text(json.dumps({"params": p, "device": _device(), "rows": _slim(rows)}, indent=1))
    print(f"wrote {a.out}")


def _slim(rows):
    return [{k: v for k, v in r.items() if k != "outputs"} for r in rows]


def _device() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
