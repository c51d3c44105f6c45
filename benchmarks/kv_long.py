"""Long-context KV-residency benchmark: kv=resident (top-k) vs kv=hisparse vs kv=adaptive on
one model, under one device KV budget, at a low, a moderate and a high load, through the real engine.

    python -m benchmarks.kv_long --out bench_long.json      # GPU: dsa_mla_7b, planned for ~5 min on one H200
    python -m benchmarks.kv_long --smoke --out smoke.json    # CPU: tiny_dsa, seconds (also automatic
                                                                # when no CUDA device is present)

The model is built once; for every (load, policy) a fresh KV policy is built on it (`rebuild_kv`, the old
one freed first) and the same greedy requests are served by `synodic.engine.engine.Engine`: every
policy prefills every prompt through its own sparse prefill path, then decodes. Recorded per run:
decode output tokens/s (and end to end), TPOT, TTFT, prefill time, admitted concurrency (max and mean
running, first admission wave), preemptions, refused / unfinished requests, selected and host-fetched
rows (fetch fraction), H2D bytes per step, device KV bytes per request, CUDA-graph use; per load,
whether the greedy output ids are identical across policies (the policies are meant to be exact).

Sizing. One device KV budget (bytes) is shared by all three policies; each policy's device pool is
sized from it by mirroring what the policy allocates (`plan_pool`, checked against the allocator on a
GPU run; on the CPU a test checks it tensor by tensor):
- resident: every page holds K|V rows and the indexer key copies of its tokens, in every layer;
- hisparse / adaptive: the indexer key cache (plus its int32 hot-slot reverse map) for every request
  at full length is fixed cost (it stays on the device); hot-buffer state and tables too; the rest of
  the budget is the device KV pool. Host pool and index pool hold every request at full length.
At the low load (default 3 requests) the budget (default: that load's full-residency demand + 3 %, 1.99 GB
for the default shape) holds every request fully, for resident and adaptive alike. At the moderate load
(default 4) the resident pool holds ~78 % of the full-residency demand (3 of 4 requests: resident must refuse
one request in four; adaptive's and hisparse's pools ~75 %: their index keys for every request come out of the
same budget); at the high load (default 6) ~52 % (3 of 6; ~46 %), twice oversubscribed. Resident queues
requests, adaptive demotes cold pages, hisparse is unaffected.
The indexer is the model's learned DSA indexer where it has one (`--indexer auto`; its keys k_I cached
in fp8 + a per-token scale: 132 B per token and layer on dsa_mla_7b, as in DSA), else the training-free
one over key copies (`--indexer bf16|fp8`: 576 / 292 B per token and layer at MLA rows).
The budget is far below an H200's KV room because every request is prefilled once per policy: the
JSON and the table say what full-HBM numbers the run stands for.

Time. The moderate load runs first (it carries the main target), then low, then high. A run is not started when its
projection (measured prefill rate, slowest decode step) would end after --deadline-s, and one in
flight is aborted at --hard-deadline-s; JSON and table are rewritten after every run, so a cut run
still leaves its rows. Kernels are compiled by a warm-up on short prompts (every policy) and one full-length
request (the first policy) before anything is timed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks._cli import compose_or_exit, nonnegative_float, out_file, positive_float, positive_int

POLICIES = ("resident", "hisparse", "adaptive")
LOADS = ("low", "moderate", "high")

# Defaults per profile; a flag given on the command line wins.
GPU = dict(model="dsa_mla_7b", device="cuda", prompt_len=16384, output_len=128, requests_low=3,
           requests_moderate=4, requests_high=6, top_k=2048, hot_buffer=None, block_size=64, tail_pages=2,
           indexer="auto", deadline_s=380.0, hard_deadline_s=440.0, warmup=True)
SMOKE = dict(model="tiny_dsa", device="cpu", prompt_len=256, output_len=12, requests_low=2,
             requests_moderate=3, requests_high=4, top_k=16, hot_buffer=None, block_size=16, tail_pages=2,
             indexer="auto", deadline_s=600.0, hard_deadline_s=900.0, warmup=True)

WHY_BUDGET = ("The device KV budget is a small slice of the H200's 141 GB because every request is prefilled "
              "once per policy per load through the {params:.2f}B-parameter model (measured: {rate}), and the whole "
              "run must finish inside the 10-minute device limit. Admission and residency depend on the ratio "
              "pool / demand, which is what is kept: scaled to the full HBM the same ratios stand for the request "
              "counts and contexts below.")


class DeadlineExceeded(RuntimeError):
    pass


# -- sizing ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What decides a policy's device footprint."""
    layers: int
    nkv: int
    head_dim: int
    dtype_bytes: int
    block_size: int
    top_k: int
    hot_buffer: int         # B
    indexer: str            # resolved: learned | bf16 | fp8
    index_head_dim: int     # learned indexer: d_I
    learned_key_dtype: str  # learned indexer: fp8 | bf16
    max_slots: int
    max_pages: int          # pages of the longest sequence (max_seq_len)
    tail_pages: int
    cuda: bool

    @property
    def row(self) -> int:                    # one token's K|V in one layer
        return 2 * self.nkv * self.head_dim * self.dtype_bytes

    @property
    def index_row(self) -> int:              # one token's cached index key in one layer (+ fp8 scales)
        if self.indexer == "learned":        # k_I [d_I] (+ one fp32 scale in fp8)
            return self.index_head_dim * (2 if self.learned_key_dtype == "bf16" else 1) + \
                (4 if self.learned_key_dtype == "fp8" else 0)
        key = self.nkv * self.head_dim * (2 if self.indexer == "bf16" else 1)
        return key + (4 * self.nkv if self.indexer == "fp8" else 0)

    @property
    def hot_pages(self) -> int:              # hisparse: B slots + the newest-token slot
        return -(-(self.hot_buffer + 1) // self.block_size)

    @property
    def adaptive_min_pages(self) -> int:     # adaptive hot-buffer mode: tail pages + B slots
        return self.tail_pages + -(-self.hot_buffer // self.block_size)


def pages_per_request(prompt_len: int, output_len: int, block_size: int) -> int:
    """Pages one request holds at its longest (prompt + output tokens, an upper bound)."""
    return -(-(prompt_len + output_len) // block_size)


def window_pages(window: int, block_size: int) -> int:
    """Pages a verify window of `window` tokens can touch (kv/config.py _HostTiered.window_pages)."""
    return 1 if window <= 1 else -(-(window - 1) // block_size) + 1


def fixed_bytes(kind: str, sh: Shape, index_pages: int, window: int = 1) -> int:
    """Device bytes a policy allocates besides its KV pool pages (mirrors synodic/kv/*.py). window > 1: a policy
    built for speculative verify windows of that many tokens (staging rows; hisparse's draft pages)."""
    S1, L, i4, i8 = sh.max_slots + 1, sh.layers, 4, 8
    out = L * i8                                                           # per-layer fetched counters
    if kind == "resident":
        return out + S1 * sh.max_pages * i4                                # block table
    out += 2 * i8                                                          # window row counters
    if window > 1:
        stage = S1 * window * sh.top_k                                     # window staging rows (one buffer)
        out += -(-stage // sh.block_size) * sh.block_size * sh.row
        if kind == "hisparse":                                             # per-slot draft pages, every layer
            out += L * S1 * window_pages(window, sh.block_size) * sh.block_size * sh.row
    B, K = sh.hot_buffer, sh.top_k
    out += L * (index_pages + 1) * sh.block_size * (sh.index_row + i4)      # indexer keys + slot_of map
    out += L * S1 * (B + 1) * i4 + L * S1 * B * i4                          # hot_pos, lru
    out += 2 * S1 * sh.max_pages * i4                                       # index + host page tables
    if sh.cuda:
        out += 2 * S1 * K * i8 + S1 * B * i4                                # resolve scratch
    if kind == "hisparse":
        out += S1 * sh.hot_pages * i4                                       # hot-buffer page table
    else:
        out += S1 * sh.max_pages * i4 + S1 * sh.hot_pages * i4              # res_table, hot_table
        out += S1 * (sh.max_pages + 1) * i8 + L * S1 * K * i4               # page stamps, last selection
    return out


def page_bytes(kind: str, sh: Shape) -> int:
    """Device bytes of one pool page (every layer)."""
    per_token = sh.row + (sh.index_row if kind == "resident" else 0)       # resident pages carry the index keys
    return sh.block_size * sh.layers * per_token


def plan_pool(kind: str, sh: Shape, budget: int, n_requests: int, ppr: int, window: int = 1, extra: int = 0) -> dict:
    """Pages of each pool for `n_requests` requests of `ppr` pages under a device budget of `budget` bytes.
    window: the verify window the policy is built for; extra: other device bytes the budget must hold (a
    drafter's context ring)."""
    index_pages = n_requests * ppr
    fixed = fixed_bytes(kind, sh, index_pages, window) + extra
    pb = page_bytes(kind, sh)
    nb = (budget - fixed) // pb - 1                                         # -1: the scratch page
    out = {"num_blocks": int(nb), "page_bytes": pb, "fixed_bytes": fixed,
           "planned_device_bytes": fixed + (nb + 1) * pb, "full_residency_pages": n_requests * ppr,
           "pool_over_demand": nb / (n_requests * ppr)}
    if kind == "resident":
        out["requests_fully_resident"] = int(nb // ppr)
    else:
        out.update(host_num_blocks=index_pages, index_num_blocks=index_pages,
                   host_bytes=sh.layers * (index_pages + 1) * sh.block_size * sh.row)
        per_req = sh.hot_pages if kind == "hisparse" else sh.adaptive_min_pages
        out["min_pages_per_request"] = per_req
        out["requests_fully_resident"] = int(nb // ppr) if kind == "adaptive" else 0
        out["requests_admissible"] = int(nb // per_req)
        if kind == "hisparse" and window > 1:
            out["draft_pages"] = window_pages(window, sh.block_size)
    return out


def full_demand(kind: str, sh: Shape, n_requests: int, ppr: int, window: int = 1, extra: int = 0) -> int:
    """Device bytes to hold n requests fully resident (what the low load's budget must cover)."""
    return (fixed_bytes(kind, sh, n_requests * ppr, window) + extra
            + (n_requests * ppr + 1) * page_bytes(kind, sh))


def kv_config(kind: str, a, plan: dict):
    from synodic.kv.config import AdaptiveKV, HiSparseKV, ResidentKV
    if kind == "resident":
        return ResidentKV(block_size=a.block_size, num_blocks=plan["num_blocks"], top_k=a.top_k, indexer=a.indexer,
                          learned_key_dtype=a.learned_key_dtype)
    tiered = dict(block_size=a.block_size, num_blocks=plan["num_blocks"], host_num_blocks=plan["host_num_blocks"],
                  index_num_blocks=plan["index_num_blocks"], top_k=a.top_k, hot_buffer=a.hot_buffer, indexer=a.indexer,
                  learned_key_dtype=a.learned_key_dtype)
    if kind == "hisparse":
        return HiSparseKV(**tiered, draft_pages=plan.get("draft_pages", 0))
    return AdaptiveKV(**tiered, tail_pages=a.tail_pages)


def pinned_bytes(n: int) -> int:
    """torch's caching host allocator rounds a pinned block up to a power of two."""
    return 1 << max(0, (n - 1).bit_length())


# -- one run ------------------------------------------------------------------------------------------
class Log:
    """Timestamped progress lines (rich colours when rich is installed, plain print otherwise)."""

    def __init__(self, t0: float):
        try:
            from rich.console import Console
            self.con = Console(highlight=False)
        except ImportError:
            self.con = None
        self.t0 = t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str, style: str | None = None) -> None:
        if self.con is None:
            print(f"{self.now():7.1f}s {msg}", flush=True)
        else:
            from rich.markup import escape
            self.con.print(f"[dim]{self.now():7.1f}s[/dim] {escape(msg)}", style=style)

    def text(self, text: str) -> None:
        if self.con is None:
            print(text, flush=True)
        else:
            self.con.print(text, markup=False, highlight=False, soft_wrap=True)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serve_one(graph, kind: str, kv_cfg, prompts: list[list[int]], output_len: int, log: Log, label: str,
              hard_deadline: float) -> tuple[dict, list[list[int]]]:
    """Fresh policy on graph.model, serve the prompts greedily; returns (row, output ids per request)."""
    from synodic.pipelines.decode import metrics

    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.kv.rebuild import free_kv, rebuild_kv
    dev = graph.device
    free_kv(graph)
    before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    t_build = time.perf_counter()
    pol = rebuild_kv(graph, kv_cfg)
    _sync(dev)
    build_s = time.perf_counter() - t_build
    alloc = torch.cuda.memory_allocated(dev) - before if before is not None else None
    reqs = [Request(i, list(p), SamplingParams(max_tokens=output_len)) for i, p in enumerate(prompts)]
    eng = Engine(graph, max_running=len(reqs))
    waves: list[int] = []
    admit = eng.scheduler.admit

    def admit_logged():
        out = admit()
        if out:
            waves.append(len(out))
            log(f"{label}: admitted {len(out)} (running {len(eng.scheduler.running)}, waiting "
                f"{len(eng.scheduler.waiting)})")
        return out
    eng.scheduler.admit = admit_logged
    prefill = eng.runner.prefill_batch
    pre_times: list[tuple[int, float]] = []

    def prefill_timed(slots, contexts):
        if log.now() > hard_deadline:
            raise DeadlineExceeded(f"hard deadline {hard_deadline:.0f}s reached during prefill")
        ts = time.perf_counter()
        out = prefill(slots, contexts)
        _sync(dev)
        dt = time.perf_counter() - ts
        n = sum(len(c) for c in contexts)
        pre_times.append((n, dt))
        log(f"{label}: prefill slots {slots}: {n} tokens in {dt:.2f}s ({n / dt:,.0f} tok/s)")
        return out
    eng.runner.prefill_batch = prefill_timed
    state = {"steps": 0, "tokens": 0, "last": time.perf_counter()}
    total = sum(r.params.max_tokens for r in reqs)

    def progress(batch: int) -> None:
        state["steps"] += 1
        state["tokens"] += batch
        if log.now() > hard_deadline:
            raise DeadlineExceeded(f"hard deadline {hard_deadline:.0f}s reached during decode")
        if time.perf_counter() - state["last"] > 5.0 or state["steps"] == 1:
            state["last"] = time.perf_counter()
            rate = eng.ledger.tokens / eng.decode_s if eng.decode_s else 0.0
            log(f"{label}: decode step {state['steps']} · batch {batch} · {state['tokens'] + len(reqs)}/{total} "
                f"tokens · {rate:,.1f} tok/s")
    log(f"{label}: kv pool {getattr(kv_cfg, 'num_blocks', 0)} pages built in {build_s:.2f}s"
        + (f" ({alloc / 1e9:.3f} GB allocated)" if alloc is not None else ""), style="bold")
    t_run = time.perf_counter()
    eng.generate(reqs, progress=progress)
    _sync(dev)
    run_s = time.perf_counter() - t_run
    m = metrics(eng, reqs)
    led = eng.ledger.summary()
    per = led["bytes_per_step"]
    st = pol.stats
    reasons = m["finish_reasons"]
    row = {
        "kv": kind, "requests": len(reqs), "num_blocks": kv_cfg.num_blocks,
        "device_alloc_bytes": alloc, "policy_build_s": build_s, "run_s": run_s,
        "cuda_graphs": bool(graph.cuda_graphs),
        "decode_tokens_per_s": m["decode_tokens_per_s"],
        "output_tokens_per_s": m["output_tokens"] / m["wall_s"] if m["wall_s"] else 0.0,
        "tpot_ms": m["tpot_ms"], "ttft_ms": m["ttft_ms"], "prefill_s": m["prefill_s"], "decode_s": m["decode_s"],
        "wall_s": m["wall_s"], "output_tokens": m["output_tokens"],
        "prefill_tokens": sum(n for n, _ in pre_times), "prefills": len(pre_times),
        "prefill_tokens_per_s": sum(n for n, _ in pre_times) / max(1e-9, sum(t for _, t in pre_times)),
        "max_running": st.get("max_running", 0), "mean_running": per.get("kv_running", 0.0),
        "first_wave": waves[0] if waves else 0, "admission_waves": waves,
        "preemptions": m["preemptions"], "finish_reasons": reasons,
        "refused": sum(v for k, v in reasons.items() if k in ("rejected_kv_capacity", "kv_capacity")),
        "unfinished": sum(v for k, v in reasons.items() if k not in ("length", "stop")),
        "decode_steps": led["decode_steps"], "overlapped_steps": eng.overlapped_steps,
        "selected_rows": led["kv"]["selected_rows"], "host_fetched_rows": led["kv"]["host_fetched_rows"],
        "fetch_fraction": led["kv"]["host_fetch_fraction"],
        "h2d_bytes_per_step": per.get("kv_h2d_bytes", 0.0), "d2h_bytes_per_step": per.get("kv_d2h_bytes", 0.0),
        "device_kv_bytes_per_request": per.get("kv_device_bytes_per_request", 0.0),
        "device_kv_bytes": per.get("kv_device_bytes", 0.0),
        "miss_rate_per_layer": [per.get(f"kv_miss_rate_layer{i}", 0.0) for i in range(pol.NL)],
    }
    for k in ("demoted_pages", "promoted_pages", "install_rows_device", "install_rows_host"):
        if k in st:
            row[k] = st[k]
    for k in ("kv_resident_page_fraction", "kv_hot_mode_requests", "kv_host_bytes"):
        if k in per:
            row[k[3:]] = per[k]
    return row, [list(r.output_ids) for r in reqs]  # the policy is freed by the next run's free_kv


def compare_outputs(outs: dict[str, list[list[int]]]) -> dict:
    kinds = list(outs)
    pairs, mism = {}, {}
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            bad = [j for j, (x, y) in enumerate(zip(outs[a], outs[b])) if x != y]
            bad += list(range(min(len(outs[a]), len(outs[b])), max(len(outs[a]), len(outs[b]))))
            pairs[f"{a}={b}"] = not bad
            if bad:
                j = bad[0]
                x, y = outs[a][j], outs[b][j] if j < len(outs[b]) else []
                first = next((t for t, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                mism[f"{a}={b}"] = {"requests": bad, "first_request": j, "first_token": first}
    # "all": every pair of the policies that ran agrees (a run of two policies compares one pair)
    return {"policies": kinds, "all": bool(pairs) and all(pairs.values()), "pairs": pairs, "mismatches": mism}


# -- report -------------------------------------------------------------------------------------------
def _f(v, fmt="{:.1f}", none="—"):
    return none if v is None else fmt.format(v)


def table_md(res: dict) -> str:
    lines = ["| load | kv | req | pool pages (pool/demand) | admitted max / mean / 1st wave | refused · unfinished · "
             "preempt | decode tok/s | e2e tok/s | TPOT ms | TTFT ms | prefill s | fetch % (fetched / selected) "
             "| H2D MB/step | dev KV MB/req | CUDA graphs | outputs identical |",
             "|" + "---|" * 16]
    order = {(ld, k): i for i, (ld, k) in enumerate((ld, k) for ld in LOADS for k in POLICIES)}
    for r in sorted(res["rows"], key=lambda r: order.get((r["load"], r["kv"]), 99)):
        load = res["loads"][r["load"]]
        ident = load.get("identical", {}).get("all")
        if "error" in r:
            lines.append(f"| {r['load']} | {r['kv']} | {load['requests']} | {r.get('num_blocks', '—')} | "
                         f"{r['error'][:90]} |" + " |" * 11)
            continue
        lines.append(
            f"| {r['load']} | {r['kv']} | {r['requests']} | {r['num_blocks']} ({100 * r['pool_over_demand']:.0f} %) | "
            f"{r['max_running']} / {r['mean_running']:.2f} / {r['first_wave']} | {r['refused']} · {r['unfinished']} · "
            f"{r['preemptions']} | {r['decode_tokens_per_s']:.1f} | {r['output_tokens_per_s']:.1f} | "
            f"{_f(r['tpot_ms'], '{:.2f}')} | "
            f"{_f(r['ttft_ms'], '{:.0f}')} | {r['prefill_s']:.2f} | {100 * r['fetch_fraction']:.2f} % "
            f"({r['host_fetched_rows']:,} / {r['selected_rows']:,}) | {r['h2d_bytes_per_step'] / 1e6:.2f} | "
            f"{r['device_kv_bytes_per_request'] / 1e6:.1f} | {'yes' if r['cuda_graphs'] else 'no'} | "
            f"{'—' if ident is None else ('yes' if ident else 'NO')} |")
    return "\n".join(lines)


def targets(res: dict) -> dict:
    """Issue 6's targets, from the rows that ran."""
    by = {(r["load"], r["kv"]): r for r in res["rows"] if "error" not in r}

    def ratio(load, a, b, key="decode_tokens_per_s"):
        ra, rb = by.get((load, a)), by.get((load, b))
        return ra[key] / rb[key] if ra and rb and rb[key] else None
    ff = {k: by[("low", k)]["fetch_fraction"] for k in POLICIES if ("low", k) in by}
    hot_mod = all(("moderate", k) in by for k in ("hisparse", "adaptive"))
    out = {
        "adaptive_over_hisparse_moderate": {"value": ratio("moderate", "adaptive", "hisparse"), "target": ">= 1.3"},
        "adaptive_over_hisparse_high": {"value": ratio("high", "adaptive", "hisparse"), "target": "reported"},
        "adaptive_over_resident_low": {"value": ratio("low", "adaptive", "resident"), "target": ">= 0.97"},
        "adaptive_fetch_fraction_low": {"value": ff.get("adaptive"), "target": "<= 0.015"},
        "hisparse_fetch_fraction_low": {"value": ff.get("hisparse"), "target": "~0.10-0.15 (reference)"},
        "resident_refuses_at_moderate": {
            "value": (by[("moderate", "resident")]["max_running"] < res["loads"]["moderate"]["requests"])
            if ("moderate", "resident") in by else None, "target": "resident admits fewer than offered"},
        "hot_policies_admit_all_moderate": {
            "value": all(by[("moderate", k)]["max_running"] == res["loads"]["moderate"]["requests"]
                         for k in ("hisparse", "adaptive")) if hot_mod else None,
            "target": "hisparse and adaptive admit every request"},
    }
    v = out["adaptive_over_hisparse_moderate"]["value"]
    out["adaptive_over_hisparse_moderate"]["met"] = None if v is None else v >= 1.3
    v = out["adaptive_over_resident_low"]["value"]
    out["adaptive_over_resident_low"]["met"] = None if v is None else v >= 0.97
    v = out["adaptive_fetch_fraction_low"]["value"]
    out["adaptive_fetch_fraction_low"]["met"] = None if v is None else v <= 0.015
    return out


def report_md(res: dict) -> str:
    b = res["budget"]
    fh = b["full_hbm"]
    out = [f"# KV residency, long context — {res['args']['model']} on {res['env']['device_name']}", "",
           f"- Command: `{res['command']}`", f"- Commit: {res['env']['git_commit']} · torch {res['env']['torch']} · "
           f"date {res['date']}",
           f"- Shape: prompt {res['args']['prompt_len']} + output {res['args']['output_len']} tokens, top_k "
           f"{res['args']['top_k']}, B {res['shape']['hot_buffer']}, block {res['args']['block_size']}, indexer "
           f"{res['shape']['indexer']}, {res['shape']['layers']} layers × {res['shape']['row']} B rows "
           f"(+{res['shape']['index_row']} B index keys) per token",
           f"- Device KV budget: **{b['bytes'] / 1e9:.3f} GB** for every policy ({b['source']}); full residency of "
           f"one request: {b['request_full_bytes'] / 1e9:.3f} GB",
           *(["- Smoke run (tiny model on the CPU): checks the machinery; the lines below are not measurements."]
             if res["args"].get("smoke") else []),
           f"- Why so small: {b['why']}",
           f"- Stands for: {fh['kv_room_gb']:.0f} GB of KV room on a {fh['hbm_gb']:.0f} GB H200 (weights "
           f"{fh['weights_gb']:.1f} GB, reserve {fh['reserve_gb']:.0f} GB) = {fh['scale']:.1f}x this budget: low / "
           f"moderate / high load = {fh['low_requests']:.0f} / {fh['moderate_requests']:.0f} / "
           f"{fh['high_requests']:.0f} requests at this context, or {fh['low_requests_100k']:.0f} / "
           f"{fh['moderate_requests_100k']:.0f} / "
           f"{fh['high_requests_100k']:.0f} at 100K; its prefill alone "
           f"(3 policies) "
           f"would take ~{_f(fh['prefill_s_estimate'], '{:.0f}')} s at the measured rate.",
           ""]
    for name, ld in res["loads"].items():
        ident = ld.get("identical", {})
        out.append(f"- {name}: {ld['requests']} requests; full residency {ld['full_residency_pages']} pages; "
                   + "; ".join(f"{k} pool {p['num_blocks']} pages ({100 * p['pool_over_demand']:.0f} % of demand)"
                               for k, p in ld["plans"].items())
                   + (f"; outputs identical: {ident.get('all')} {ident.get('pairs', '')}" if ident else ""))
    if any(ld.get("identical") and not ld["identical"]["all"] for ld in res["loads"].values()):
        out.append("- Outputs differ somewhere: see `loads.<load>.identical.mismatches` in the JSON. Where resident "
                   "ran smaller batches (queued requests) than the others, a batch-size-dependent GEMM reduction can "
                   "flip a near-tied greedy token without any KV placement difference; hisparse=adaptive run the "
                   "same batches.")
    return "\n".join(out + report_tail(res, table_md(res), 6)) + "\n"


def report_tail(res: dict, table: str, issue: int) -> list[str]:
    """The end of every report of this family (kv_long_spec too): the table, the targets (value, target, met) of
    the given issue, and what was skipped."""
    out = ["", table, "", f"Targets (issue {issue}):", ""]
    for k, t in res["targets"].items():
        v = t["value"]
        vs = "—" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
        met = "" if t.get("met") is None else ", met" if t["met"] else ", MISSED"
        out.append(f"- {k}: {vs} (target {t['target']}{met})")
    if res.get("skipped"):
        out += ["", "Skipped: " + "; ".join(res["skipped"])]
    return out


def plot(res: dict, path: Path) -> None:
    plot_bars(res, path, LOADS, "kv", POLICIES,
              ("decode output tokens/s (labels: admitted / offered)", "host fetches, % of selected rows"),
              f"{res['args']['model']}: prompt {res['args']['prompt_len']}, device KV budget "
              f"{res['budget']['bytes'] / 1e9:.3g} GB",
              label=lambda r, ld: f"{r['max_running']}/{res['loads'][ld]['requests']}")


def plot_bars(res: dict, path: Path, loads, key: str, names, titles, suptitle: str, label=None) -> None:
    """Two bar charts per load, one bar per name (the rows' `key`: kv policy or kv_long_spec's variant): decode
    tokens/s and the host fetch fraction. label(row, load): text over the tokens/s bar (none by default)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = {(r["load"], r[key]): r for r in res["rows"] if "error" not in r}
    loads = [ld for ld in loads if ld in res["loads"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * w for i in range(len(loads))]
        tps = [rows[(ld, name)]["decode_tokens_per_s"] if (ld, name) in rows else 0 for ld in loads]
        ff = [100 * rows[(ld, name)]["fetch_fraction"] if (ld, name) in rows else 0 for ld in loads]
        bars = axes[0].bar(xs, tps, w, label=name)
        for x, ld, bar in zip(xs, loads, bars):
            if label and (ld, name) in rows:
                axes[0].annotate(label(rows[(ld, name)], ld), (x, bar.get_height()), ha="center", va="bottom",
                                 fontsize=8)
        axes[1].bar(xs, ff, w, label=name)
    for ax, title in zip(axes, titles):
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels([f"{ld} ({res['loads'][ld]['requests']} req)" for ld in loads])
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(res: dict, out: Path, with_plot: bool = False, report=None) -> None:
    """JSON, markdown table and (with_plot) png of a run. report: (targets, report_md, plot) of another
    benchmark of this family (kv_long_spec), this module's by default."""
    targets_of, md_of, plot_of = report or (targets, report_md, plot)
    res["targets"] = targets_of(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    out.with_suffix(".md").write_text(md_of(res))
    if with_plot:
        try:
            plot_of(res, out.with_suffix(".png"))
        except ImportError as e:  # the JSON and the table are what count
            print(f"no plot: {e}")


# -- main ---------------------------------------------------------------------------------------------
def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default="bench_long.json",
                    help="JSON path (the .md table and .png plot go next to it)")
    ap.add_argument("--smoke", action="store_true", help="tiny_dsa on the CPU, tiny sizes (automatic without CUDA)")
    ap.add_argument("--model")
    ap.add_argument("--weights", default="random", help="model.weights: random (default), auto, or a checkpoint "
                    "directory (e.g. one written by `python -m benchmarks.kv_locality --save-distilled DIR`)")
    ap.add_argument("--prompts", choices=("random", "heldout"), default="random",
                    help="random token ids (default), or consecutive slices of the shipped held-out text tokenized "
                    "with the model's tokenizer (a trained model's selections need real text to show locality)")
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--prompt-len", type=positive_int)
    ap.add_argument("--output-len", type=positive_int)
    ap.add_argument("--requests-low", type=positive_int, help="requests (all offered at once) at the low load")
    ap.add_argument("--requests-moderate", type=positive_int, help="requests at the moderate load")
    ap.add_argument("--requests-high", type=positive_int, help="requests at the high load")
    ap.add_argument("--top-k", type=positive_int)
    ap.add_argument("--hot-buffer", type=positive_int, help="B (default 2 * top_k)")
    ap.add_argument("--block-size", type=positive_int)
    ap.add_argument("--tail-pages", type=positive_int)
    ap.add_argument("--indexer", choices=("auto", "learned", "bf16", "fp8"), help="kv.indexer: auto = the model's "
                    "learned DSA indexer when it has one; bf16 / fp8 = training-free over key copies")
    ap.add_argument("--learned-key-dtype", choices=("fp8", "bf16"), default="fp8",
                    help="learned indexer: dtype of its cached keys")
    ap.add_argument("--budget-gb", type=positive_float, help="device KV budget in GB (1e9 B) shared by all policies; "
                    "default: the low load's full-residency demand + --budget-margin")
    ap.add_argument("--budget-margin", type=nonnegative_float, default=0.03)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="moderate,low,high", help="run order (moderate first: it carries the main "
                    "target, so a run cut by the deadline loses low- and high-load rows first)")
    ap.add_argument("--plan-only", action="store_true", help="print the pool sizing and exit (no model)")
    ap.add_argument("--threads", type=positive_int, help="torch CPU threads (smoke default 1: robust on a shared CPU)")
    ap.add_argument("--deadline-s", type=positive_float,
                    help="do not start a run projected to end after this (s since start)")
    ap.add_argument("--hard-deadline-s", type=positive_float, help="abort a run in flight after this (s since start)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                    help="compile the kernels on short prompts first (default on CUDA)")
    ap.add_argument("--hbm-gb", type=positive_float, default=141.0, help="HBM the budget is scaled to in the report")
    ap.add_argument("--reserve-gb", type=nonnegative_float, default=16.0,
                    help="activations etc. kept out of the full-HBM KV room")
    ap.add_argument("--host-limit-gb", type=positive_float, default=90.0, help="most pinned host memory allowed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="overlapped decode steps (runtime.overlap; default: on where the policy allows; --no-overlap: "
                         "one host sync per step, for A/B)")
    a = ap.parse_args(argv)
    if not a.smoke and not torch.cuda.is_available() and a.device != "cuda":
        a.smoke = True
    prof = SMOKE if a.smoke else GPU
    for k, v in prof.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.hot_buffer = a.hot_buffer or 2 * a.top_k
    a.policies = [p for p in a.policies.split(",") if p]
    a.loads = [ld for ld in a.loads.split(",") if ld]
    bad = [p for p in a.policies if p not in POLICIES] + [ld for ld in a.loads if ld not in LOADS]
    if bad:
        ap.error(f"unknown policy/load {bad}; expected {POLICIES} / {LOADS}")
    compose_or_exit(ap, [f"model={a.model}", f"model.weights={a.weights}"],
                    {"model.weights": "--weights", "model": "--model"})
    return a


def heldout_prompts(codec, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens: consecutive slices of the shipped held-out text, tokenized with `codec`."""
    from synodic.data.corpus import heldout_tokens
    try:
        ids = heldout_tokens(codec.encode, n * length)
    except ValueError as e:
        raise SystemExit(f"bench_long: --prompts heldout with {n} x --prompt-len {length}: {e}") from None
    return [ids[i * length:(i + 1) * length] for i in range(n)]


def main(argv=None) -> dict:
    return run_main(parse, _main, argv)


def run_main(parse_of, main_of, argv) -> dict:
    """parse_of(argv), then main_of(args, argv, t0) with torch's CPU threads set for the run (--threads; one thread
    for a CPU smoke run) and given back after: the entry point of every benchmark of this family."""
    t0 = time.perf_counter()
    a = parse_of(argv)
    threads = torch.get_num_threads()
    if a.threads or (a.smoke and a.device == "cpu"):
        torch.set_num_threads(a.threads or 1)
    try:
        return main_of(a, argv, t0)
    finally:
        torch.set_num_threads(threads)


def _main(a, argv, t0: float) -> dict:
    log = Log(t0)
    out = Path(a.out)
    from synodic.config.compose import compose
    from synodic.engine.workload import SyntheticWorkload, build_requests
    from synodic.graph import build_graph
    from synodic.results.env import environment

    n_max = max(getattr(a, f"requests_{ld}") for ld in LOADS)
    max_seq = a.prompt_len + a.output_len + 1
    cfg = compose([f"model={a.model}", f"model.weights={a.weights}", f"runtime.device={a.device}",
                   f"runtime.max_slots={n_max}", "kv=resident", f"kv.top_k={a.top_k}", "kv.num_blocks=1",
                   f"kv.block_size={a.block_size}", f"kv.indexer={a.indexer}",
                   f"kv.learned_key_dtype={a.learned_key_dtype}", f"runtime.seed={a.seed}",
                   f"runtime.overlap={ {None: 'null', True: 'true', False: 'false'}[a.overlap]}"])
    arch = cfg.model.architecture()
    ix = a.indexer if a.indexer in ("bf16", "fp8") else "learned" if arch.index_n_heads else "bf16"
    if a.indexer == "learned" and not arch.index_n_heads:
        log(f"error: --indexer learned: model {a.model} carries no learned indexer", style="red")
        raise SystemExit(2)
    dev = torch.device(a.device)
    dsz = torch.empty(0, dtype={"bfloat16": torch.bfloat16, "float16": torch.float16,
                                "float32": torch.float32}[cfg.model.dtype]).element_size()
    sh = Shape(layers=sum(k == "attention" for layer in arch.blocks() for k in layer), nkv=arch.num_key_value_heads,
               head_dim=arch.head_dim, dtype_bytes=dsz, block_size=a.block_size, top_k=a.top_k, hot_buffer=a.hot_buffer,
               indexer=ix, index_head_dim=arch.index_head_dim, learned_key_dtype=a.learned_key_dtype,
               max_slots=n_max, max_pages=-(-max_seq // a.block_size), tail_pages=a.tail_pages, cuda=dev.type == "cuda")
    ppr = pages_per_request(a.prompt_len, a.output_len, a.block_size)
    n = {ld: getattr(a, f"requests_{ld}") for ld in LOADS}
    need_low = max(full_demand(k, sh, n["low"], ppr) for k in ("resident", "adaptive"))
    if a.budget_gb is not None:
        budget, source = int(a.budget_gb * 1e9), "--budget-gb"
    else:
        step = 10 ** max(0, int(math.log10(need_low)) - 2)           # round up to 3 significant digits
        budget = int(math.ceil(need_low * (1 + a.budget_margin) / step) * step)
        source = f"auto: low-load full-residency demand {need_low / 1e9:.3f} GB + {100 * a.budget_margin:.0f} %"
    plans = {ld: {k: plan_pool(k, sh, budget, n[ld], ppr) for k in POLICIES} for ld in LOADS}
    problems = []
    for ld in LOADS:
        for k, p in plans[ld].items():
            if p["num_blocks"] < 1:
                problems.append(f"{ld}/{k}: the budget leaves no pool pages")
            if k != "resident" and pinned_bytes(p["host_bytes"]) > a.host_limit_gb * 1e9:
                problems.append(f"{ld}/{k}: host pool {p['host_bytes'] / 1e9:.1f} GB (pinned "
                                f"{pinned_bytes(p['host_bytes']) / 1e9:.1f} GB) over --host-limit-gb {a.host_limit_gb}")
    if a.plan_only:
        log(f"budget {budget / 1e9:.3f} GB ({source}); pages per request {ppr}")
        for ld in LOADS:
            for k, p in plans[ld].items():
                log(f"  {ld:9s} {k:9s} " + json.dumps({key: v for key, v in p.items() if key != 'page_bytes'}))
        for w in problems:
            log(f"error: {w}", style="red")
        return {"budget": budget, "plans": plans, "problems": problems, "shape": asdict(sh), "ppr": ppr}
    if problems:
        for p in problems:
            log(f"error: {p}", style="red")
        raise SystemExit(2)
    warn = []
    for k in ("resident", "adaptive"):
        if plans["low"][k]["requests_fully_resident"] < n["low"]:
            warn.append(f"low load: {k} holds only {plans['low'][k]['requests_fully_resident']} of {n['low']} "
                        "requests fully resident (budget too small for a 'low' load)")
    for ld, lo, hi in (("moderate", 0.6, 0.9), ("high", 0.4, 0.65)):
        r = plans[ld]["resident"]["pool_over_demand"]
        if not lo <= r <= hi:
            warn.append(f"{ld} load: resident pool holds {100 * r:.0f} % of the full-residency demand "
                        f"(intended {100 * lo:.0f}-{100 * hi:.0f} %)")
        for k in ("hisparse", "adaptive"):
            p = plans[ld][k]
            if p["requests_admissible"] < n[ld]:
                warn.append(f"{ld} load: {k} can hold only {p['requests_admissible']} hot-buffer requests")
    for w in warn:
        log(f"warning: {w}", style="yellow")

    res = {**result_head("kv_long (issue 6)", "benchmarks.kv_long", a, argv, sh, ppr),
           "loads": {}, "rows": [], "skipped": [], "warnings": warn, "warmup": []}
    log(f"bench_long: model={a.model} device={a.device} prompt={a.prompt_len} output={a.output_len} "
        f"top_k={a.top_k} B={a.hot_buffer} block={a.block_size} indexer={ix} ({sh.index_row} B/token/layer) loads="
        f"{ {ld: n[ld] for ld in a.loads} }", style="bold")
    log(f"device KV budget {budget / 1e9:.3f} GB ({source}); one request fully resident: "
        f"{full_demand('resident', sh, 1, ppr) / 1e9:.3f} GB")
    for ld in LOADS:
        log(f"  {ld:9s}: " + " · ".join(f"{k} {p['num_blocks']} pages ({100 * p['pool_over_demand']:.0f} %)"
                                        for k, p in plans[ld].items()))

    # -- model, once
    ts = time.perf_counter()
    log(f"building {a.model} ({a.weights} weights) on {dev} ...")
    graph = build_graph(cfg, max_seq, n_max)
    _sync(dev)
    weights = sum(p.numel() * p.element_size() for p in graph.model.parameters())
    res["model"] = {"kind": a.model, "params": sum(p.numel() for p in graph.model.parameters()),
                    "weight_bytes": weights, "build_s": time.perf_counter() - ts, "dtype": cfg.model.dtype}
    res["env"] = environment(dev)
    log(f"model: {res['model']['params'] / 1e9:.2f}B params, {weights / 1e9:.1f} GB, built in "
        f"{res['model']['build_s']:.1f}s")
    wl = SyntheticWorkload(kind="long", num_requests=n_max, prompt_len=a.prompt_len, output_len=a.output_len,
                           concurrency=n_max, seed=a.seed)
    prompts = ([r.prompt_ids for r in build_requests(wl, graph.codec, arch.vocab_size)] if a.prompts == "random"
               else heldout_prompts(graph.codec, n_max, a.prompt_len))

    # -- warm-up: compile every kernel path on short prompts (resident queueing, hot-buffer misses, adaptive
    #    demotion: two requests whose pool fits both only in hot-buffer mode), so no run pays for compiles
    if a.warmup:
        wp = min(a.prompt_len, a.hot_buffer + 2 * a.block_size)
        wppr = pages_per_request(wp, 4, a.block_size)
        wbudget = int(full_demand("resident", sh, 1, wppr) * 1.3)
        wprompts = [p[:wp] for p in prompts[:2]]
        for k in a.policies:
            ts = time.perf_counter()
            try:
                plan = plan_pool(k, sh, wbudget, 2, wppr)
                if k != "resident":
                    plan["num_blocks"] = 2 * plan["min_pages_per_request"] + 1
                row, _ = serve_one(graph, k, kv_config(k, a, plan), wprompts, 4, log, f"warm-up {k}", float("inf"))
                res["warmup"].append({"kv": k, "s": time.perf_counter() - ts, "prompt_len": wp,
                                      **{key: row.get(key) for key in ("max_running", "host_fetched_rows",
                                                                       "demoted_pages", "prefill_tokens_per_s")}})
            except Exception as e:  # noqa: BLE001 - reported, the measured run will show it again
                res["warmup"].append({"kv": k, "error": f"{type(e).__name__}: {e}"})
                log(f"warm-up {k} failed: {type(e).__name__}: {e}", style="red")
        if a.prompt_len > wp:
            # one full-length request on the first policy: kernels whose tiles follow the context length (prefill
            # index scores and selection, the decode step's page view) compile here, not in the first timed run
            # (H200: the first policy timed after short-prompt warm-up alone ran at 150 tok/s and 16 s of prefill
            # where a repeat gave 210 tok/s and 7.5 s)
            k = a.policies[0]
            ts = time.perf_counter()
            try:
                plan = plan_pool(k, sh, int(full_demand(k, sh, 1, ppr) * 1.3), 1, ppr)
                serve_one(graph, k, kv_config(k, a, plan), prompts[:1], 2, log, f"warm-up {k} full length",
                          float("inf"))
                res["warmup"].append({"kv": k, "s": time.perf_counter() - ts, "prompt_len": a.prompt_len})
            except Exception as e:  # noqa: BLE001 - reported, the measured run will show it again
                res["warmup"].append({"kv": k, "error": f"{type(e).__name__}: {e}"})
                log(f"warm-up {k} (full length) failed: {type(e).__name__}: {e}", style="red")
        rate = [r for r in res["warmup"] if "s" in r]
        if rate:
            log(f"warm-up done in {sum(r['s'] for r in rate):.1f}s", style="bold")

    # -- budget section (prefill rate filled in as runs complete)
    room = a.hbm_gb * 1e9 - weights - a.reserve_gb * 1e9
    scale = room / budget
    at_100k = (a.prompt_len + a.output_len) / (100_000 + a.output_len)
    res["budget"] = {"bytes": budget, "source": source, "request_full_bytes": full_demand("resident", sh, 1, ppr),
                     "why": WHY_BUDGET.format(params=res["model"]["params"] / 1e9, rate="see prefill tok/s"),
                     "full_hbm": {"hbm_gb": a.hbm_gb, "weights_gb": weights / 1e9, "reserve_gb": a.reserve_gb,
                                  "kv_room_gb": room / 1e9, "scale": scale,
                                  "low_requests": n["low"] * scale, "moderate_requests": n["moderate"] * scale,
                                  "low_requests_100k": n["low"] * scale * at_100k,
                                  "moderate_requests_100k": n["moderate"] * scale * at_100k,
                                  "high_requests": n["high"] * scale, "high_requests_100k": n["high"] * scale * at_100k,
                                  "prefill_s_estimate": None}}
    for ld in LOADS:
        res["loads"][ld] = {"requests": n[ld], "full_residency_pages": n[ld] * ppr, "plans": plans[ld]}

    # -- measured runs
    from synodic.kv.rebuild import free_kv
    history: list[dict] = []
    for ld in a.loads:
        outs = {}
        free_kv(graph)  # the last run's policy, so its pinned host pool can be dropped below
        if dev.type == "cuda" and hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # a new load has a new host-pool size: drop cached pinned blocks
        for k in a.policies:
            label = f"{ld} · {k}"
            plan = plans[ld][k]
            est = estimate_s(history, n[ld], a, plan, ppr)
            if log.now() > a.deadline_s or (est is not None and log.now() + est > a.deadline_s):
                msg = (f"{label}: skipped at {log.now():.0f}s, projected {_f(est, '{:.0f}')}s would end after "
                       f"--deadline-s {a.deadline_s:.0f}")
                log(msg, style="yellow")
                res["skipped"].append(msg)
                continue
            log(f"── {label}: {n[ld]} requests, pool {plan['num_blocks']} pages "
                f"({100 * plan['pool_over_demand']:.0f} % of full residency; device "
                f"{plan['planned_device_bytes'] / 1e9:.3f} GB planned)"
                + (f", projected {est:.0f}s" if est is not None else ""), style="bold cyan")
            base = {"load": ld, "kv": k, "num_blocks": plan["num_blocks"], "pool_over_demand": plan["pool_over_demand"],
                    "planned_device_bytes": plan["planned_device_bytes"]}
            try:
                row, outputs = serve_one(graph, k, kv_config(k, a, plan), prompts[:n[ld]], a.output_len, log, label,
                                         a.hard_deadline_s)
                row = {**base, **row}
                outs[k] = outputs
                history.append(row)
                log(f"{label}: decode {row['decode_tokens_per_s']:.1f} tok/s · "
                    f"TPOT {_f(row['tpot_ms'], '{:.2f}')} ms · "
                    f"TTFT {_f(row['ttft_ms'], '{:.0f}')} ms · admitted max {row['max_running']}/{n[ld]} · fetch "
                    f"{100 * row['fetch_fraction']:.2f} % · preempt {row['preemptions']} · run {row['run_s']:.1f}s",
                    style="green")
            except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
                row = failed_row(graph, base, e, log, label)
            res["rows"].append(row)
            if outs:
                res["loads"][ld]["identical"] = compare_outputs(outs)
            update_prefill_estimate(res, history, a)
            write(res, out)
        if outs:
            ident = res["loads"][ld]["identical"]
            log(f"{ld}: greedy outputs identical across {', '.join(ident['policies'])}: {ident['all']} "
                f"{ident['pairs']}", style="green" if ident["all"] else "yellow")
    free_kv(graph)
    write(res, out, with_plot=True)
    log.text(report_md(res))
    log(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}", style="bold")
    return res


def failed_row(graph, base: dict, e: Exception, log: Log, label: str) -> dict:
    """The row of a run that raised (called in its except block): its policy freed so the next run has the
    memory, the error and the end of its traceback kept, the failure logged."""
    from synodic.kv.rebuild import free_kv
    row = {**base, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    # the traceback's finished frames hold the failed run's engine (and through it the pool): drop their
    # locals, or free_kv returns nothing and every later variant runs out of memory
    traceback.clear_frames(e.__traceback__)
    free_kv(graph)
    log(f"{label}: FAILED {row['error']}", style="red")
    return row


def result_head(bench: str, module: str, a, argv, sh: Shape, ppr: int) -> dict:
    """The first keys of a run's JSON in this family: what ran, when, the command line, its arguments, the shape."""
    return {"bench": bench, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv),
            "args": dict(vars(a)),
            "shape": {**asdict(sh), "row": sh.row, "index_row": sh.index_row, "pages_per_request": ppr}}


def estimate_s(history: list[dict], n_req: int, a, plan: dict, ppr: int) -> float | None:
    """Projected seconds of a run from the runs so far: prefill at the measured token rate, decode at the
    slowest measured step time, resident in as many waves as its pool needs."""
    if not history:
        return None
    pre = sum(r["prefill_tokens"] for r in history) / max(1e-9, sum(r["prefill_s"] for r in history))
    step = max(r["decode_s"] / max(1, r["decode_steps"]) for r in history)
    waves = 1
    if plan.get("requests_fully_resident") and "host_num_blocks" not in plan:
        waves = -(-n_req // max(1, plan["requests_fully_resident"]))
    return n_req * a.prompt_len / pre + waves * a.output_len * step * 1.2 + 5.0


def update_prefill_estimate(res: dict, history: list[dict], a) -> None:
    if not history:
        return
    rate = sum(r["prefill_tokens"] for r in history) / max(1e-9, sum(r["prefill_s"] for r in history))
    fh = res["budget"]["full_hbm"]
    res["budget"]["measured_prefill_tokens_per_s"] = rate
    res["budget"]["why"] = WHY_BUDGET.format(params=res["model"]["params"] / 1e9,
                                             rate=f"{rate:,.0f} prefill tokens/s, {a.prompt_len / rate:.1f} s per "
                                                  f"{a.prompt_len}-token prompt")
    offered = sum(fh[f"{ld}_requests"] for ld in LOADS)
    fh["prefill_s_estimate"] = len(POLICIES) * offered * a.prompt_len / rate


if __name__ == "__main__":
    main()
