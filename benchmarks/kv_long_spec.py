"""Long-context speculative decoding under KV residency (issue 32): kv=adaptive and kv=hisparse with spec=dflash2
under forced acceptance, against plain (non-speculative) decoding, at 32K-token contexts x 64 concurrent requests,
through the real engine, on one device KV budget.

    python -m benchmarks.kv_long_spec --plan-only                 # sizing only (no model): check before a GPU run
    python -m benchmarks.kv_long_spec --out long_spec.json        # GPU: dsa_mla_7b (random weights), ~4 min on an H200
    python -m benchmarks.kv_long_spec --smoke --out smoke.json    # CPU: tiny_dsa, seconds (automatic without CUDA)

Variants (`--variants`, default `adaptive+spec,hisparse+spec,adaptive,hisparse`): a KV policy, speculative
(`+spec`: spec=dflash2 with `--gamma` drafts, default 3) or plain. Two loads, as in `benchmarks.kv_long`, under
one device KV budget (default: the low load's full-residency demand + 3 %): `moderate` (default 64 requests),
where adaptive must demote pages, run first; `low` (default 48), where every adaptive request stays resident.
Sizing mirrors what each policy allocates (kv_long's `plan_pool`), including what a policy built for verify
windows adds (staging rows; hisparse's draft pages) and, for speculative variants, the drafter's context ring:
every variant's pool is what is left of the same budget after its own fixed costs.

Acceptance (`--acceptance`, default forced): random-weight drafters accept nothing, so the drafter runs in full
every step and its drafts become the target's greedy continuation (the reference: a plain run of the distinct
prompts, computed once) kept at `--rates` per position (default 0.8; synodic/spec/controlled.py,
docs/measuring.md "Controlled acceptance"); `forced` also forces the verify's decision to the draws.

Contexts (benchmarks/context_fill.py): `--distinct` prompts (default 2) are prefilled once for real (inside the
reference run, untimed); every request of every variant is then seeded by replaying that prefill into its own
slot through the KV policy's own `write_prefill`, so 64 x 32K contexts cost seconds instead of minutes of
prefill. Request i holds prompt i mod distinct, in its own pages, host rows and index pages.

What is timed: `--steps` engine steps (default 16) after `--warmup-steps` untimed ones (default 3) with every
request in the batch (nobody finishes inside the window; the engine is stopped at its end): decode tokens/s,
tokens per row-step, selected and host-fetched rows (fetch %), host-fetch and H2D bytes per step and per token,
demotions. Identity: within a load, the variants with the same speculation must agree — plain variants on their
greedy output ids; forced variants (whose outputs equal the reference by construction) on the digest of the
target's own verify decisions (`ControlledDrafter.verify_digest`), i.e. on the argmax of every verify window.

Host memory: the host-tiered policies keep every request's full KV in one pinned host pool (64 x 32K tokens of
dsa_mla_7b: ~72 GB). It is pinned once at its exact size (torch's host allocator would round it up to a power of
two, 137 GB, more than the machine's RAM) and every policy build reuses it (`rebuild_kv(host_buffer=)`):
`--host-limit-gb` bounds it.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import kv_long as kl
from benchmarks._cli import compose_or_exit, nonnegative_float, out_file, positive_float, positive_int

LOADS = ("moderate", "low")
POLICIES = ("resident", "hisparse", "adaptive")
VARIANTS = "adaptive+spec,hisparse+spec,adaptive,hisparse"

GPU = dict(model="dsa_mla_7b", device="cuda", prompt_len=32512, requests_low=48, requests_moderate=64, top_k=2048,
           hot_buffer=None, block_size=64, tail_pages=2, indexer="auto", gamma=3, steps=16, warmup_steps=3,
           distinct=2, deadline_s=210.0, hard_deadline_s=240.0, warmup=False)
SMOKE = dict(model="tiny_dsa", device="cpu", prompt_len=160, requests_low=3, requests_moderate=4, top_k=16,
             hot_buffer=None, block_size=16, tail_pages=2, indexer="auto", gamma=3, steps=5, warmup_steps=2,
             distinct=2, deadline_s=600.0, hard_deadline_s=900.0, warmup=False)


class DeadlineExceeded(RuntimeError):
    pass


def parse_variant(v: str) -> tuple[str, bool]:
    kind, _, spec = v.partition("+")
    if kind not in POLICIES or spec not in ("", "spec"):
        raise ValueError(v)
    return kind, spec == "spec"


def vname(kind: str, spec: bool) -> str:
    return kind + ("+spec" if spec else "")


def max_tokens(a, spec: bool) -> int:
    """Output tokens a request may hold: enough that nobody finishes before the last timed step (the engine is
    stopped there); a speculative row emits up to 1 + γ tokens a step."""
    n = a.warmup_steps + a.steps + 1
    return 1 + (n + 1) * (a.gamma + 1) if spec else 1 + n + 1


def ring_bytes_planned(a, dsz: int, slots: int, max_seq: int) -> int:
    """The dflash2 drafter's context ring (random drafter: DraftConfig's default shape, the target's dtype), as
    the graph allocates it (DraftModel.allocate)."""
    from synodic.spec.models.config import DraftConfig
    f = DraftConfig.model_fields
    W = min(a.context_window, max_seq)
    kv = 2 * f["num_layers"].default * f["num_kv_heads"].default * f["head_dim"].default * dsz
    return (slots + 1) * (W + 1) * (kv + 8)  # K and V rows of every draft layer + the int64 position of each


# -- host memory ----------------------------------------------------------------------------------------
def host_arena(nbytes: int, device) -> tuple[torch.Tensor, str]:
    """One byte buffer for every host pool of the run, pinned once at its exact size on a GPU run."""
    if device.type != "cuda":
        return torch.zeros(nbytes, dtype=torch.uint8), "pageable (CPU run)"
    try:
        # above 1 GiB torch's caching host allocator then neither rounds a block up to a power of two nor caches it
        torch._C._accelerator_setAllocatorSettings("pinned_max_cached_size_mb:1024")
        exact = None
    except (ValueError, RuntimeError, AttributeError) as e:
        # an older torch without the key would round a 72 GB pool up to 137 GB (more than the RAM): never try it
        exact = e
    if exact is None:
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            held = torch.cuda.host_memory_stats().get("allocated_bytes.current")  # as pinned (rounded or not)
            return t, f"pinned (cudaHostAlloc; the host allocator holds {_gb(held)} GB)"
        except RuntimeError as e:
            exact = e
    # register pageable memory ourselves: pinned at its exact size whatever the allocator does
    t = torch.empty(nbytes, dtype=torch.uint8)
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)  # default flags: mapped, portable (UVA)
    if int(rc) != 0:
        raise RuntimeError(f"pinning a {nbytes / 1e9:.1f} GB host pool failed ({exact}; cudaHostRegister: {rc})")
    return t, f"pinned (cudaHostRegister; {type(exact).__name__} from the allocator path)"


def _gb(n) -> str:
    return "?" if n is None else f"{n / 1e9:.2f}"


# -- one variant ------------------------------------------------------------------------------------------
def run_variant(graph, inner, fill, arena, a, kind: str, spec: bool, plan: dict, n: int, prompts, reference,
                log, label: str, hard_deadline: float, steps: int | None = None, warm: int | None = None) -> tuple:
    """Fresh policy, n requests (prompt i mod len(prompts)) seeded by the fill, warm + timed engine steps.
    Returns (row, output ids per request)."""
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.kv.rebuild import free_kv, rebuild_kv
    from synodic.spec.controlled import ControlledDrafter, conditional_rates
    S, W = steps or a.steps, warm or a.warmup_steps
    dev = graph.device
    free_kv(graph)
    before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    ts = time.perf_counter()
    rebuild_kv(graph, kl.kv_config(kind, a, plan), window=a.gamma + 1 if spec else 1,
                     host_buffer=arena if kind != "resident" else None)
    kl._sync(dev)
    build_s = time.perf_counter() - ts
    alloc = torch.cuda.memory_allocated(dev) - before if before is not None else None
    mt = max_tokens(a, spec)
    reqs = [Request(i, list(prompts[i % len(prompts)]), SamplingParams(max_tokens=mt)) for i in range(n)]
    drafter = None
    if spec:
        drafter = inner
        if a.acceptance != "real":
            ref = {r.id: reference[r.id % len(prompts)] for r in reqs}
            drafter = ControlledDrafter(inner, a.gamma, a.rates, ref, graph.model.config.vocab_size, a.acceptance_seed,
                                        graph.max_slots, graph.max_seq_len, dev, force=a.acceptance == "forced")
    graph.spec = drafter
    try:
        eng = Engine(graph, max_running=n)
    finally:
        graph.spec = inner
    fill.install(eng)
    fill0 = dict(fill.stats)
    k0, k1 = W - 1, W + S - 1
    marks: dict[int, tuple] = {}
    tick = [-1]
    batch = [0]  # most rows in one step
    last = [time.perf_counter()]

    def snap():
        return (time.perf_counter(), eng.runner.capture_s, dict(eng.ledger.totals), eng.ledger.tokens,
                eng.spec_stats.emitted)

    def progress(live: int) -> None:
        k = tick[0] = tick[0] + 1
        batch[0] = max(batch[0], live)
        if log.now() > hard_deadline:
            raise DeadlineExceeded(f"hard deadline {hard_deadline:.0f}s reached during decode")
        if k == 0:
            f = {key: fill.stats[key] - fill0[key] for key in fill0}
            log(f"{label}: {n} contexts seeded ({f['real']} prefilled in {f['real_s']:.1f}s, {f['replayed']} replayed "
                f"in {f['replay_s']:.1f}s); first step done")
        if k == k0:
            marks[0] = snap()
        elif k == k1:
            marks[1] = snap()
            eng.stop("bench_end")
        elif time.perf_counter() - last[0] > 5.0:
            last[0] = time.perf_counter()
            log(f"{label}: step {k + 1}/{k1 + 1} · batch {live}")
    log(f"{label}: kv pool {plan['num_blocks']} pages built in {build_s:.2f}s"
        + (f" ({alloc / 1e9:.3f} GB allocated, {plan['planned_device_bytes'] / 1e9:.3f} GB planned)"
           if alloc is not None else ""), style="bold")
    eng.generate(reqs, progress=progress)
    kl._sync(dev)
    if 1 not in marks:
        raise RuntimeError(f"{label}: the engine ran {tick[0] + 1} steps, expected {k1 + 1}")
    off = [r.id for r in reqs if r.preemptions or r.finish_reason != "bench_end"]
    (t0, c0, L0, n0, e0), (t1, c1, L1, n1, e1) = marks[0], marks[1]
    dt = t1 - t0 - (c1 - c0)
    tokens = (e1 - e0) if spec else (n1 - n0)
    d = {key: L1[key] - L0.get(key, 0) for key in L1}
    sel, fetched = d.get("kv_selected_rows", 0), d.get("kv_host_fetched_rows", 0)
    fs = {key: fill.stats[key] - fill0[key] for key in fill0}
    row = {
        "variant": vname(kind, spec), "kv": kind, "spec": spec, "requests": n, "num_blocks": plan["num_blocks"],
        "pool_over_demand": plan["pool_over_demand"], "planned_device_bytes": plan["planned_device_bytes"],
        "device_alloc_bytes": alloc, "policy_build_s": build_s, "cuda_graphs": bool(graph.cuda_graphs),
        "timed_steps": S, "warmup_steps": W, "timed_s": dt, "step_ms": 1e3 * dt / S, "tokens": tokens,
        "decode_tokens_per_s": tokens / dt if dt > 0 else 0.0, "tokens_per_row_step": tokens / S / n,
        "selected_rows": sel, "host_fetched_rows": fetched, "fetch_fraction": fetched / sel if sel else 0.0,
        "host_fetch_bytes_per_step": d.get("kv_host_fetch", 0) / S,
        "host_fetch_bytes_per_token": d.get("kv_host_fetch", 0) / max(1, tokens),
        "h2d_bytes_per_step": d.get("kv_h2d_bytes", 0) / S, "d2h_bytes_per_step": d.get("kv_d2h_bytes", 0) / S,
        "window_fetch_bytes_per_step": d.get("kv_window_fetch_bytes", 0) / S,
        "window_per_query_fetch_bytes_per_step": d.get("kv_window_per_query_fetch_bytes", 0) / S,
        "demoted_pages": d.get("kv_demoted_pages", 0), "promoted_pages": d.get("kv_promoted_pages", 0),
        "resident_page_fraction": d.get("kv_resident_page_fraction", 1.0 * S) / S if kind == "adaptive" else None,
        "hot_mode_requests": d.get("kv_hot_mode_requests", 0) / S if kind == "adaptive" else None,
        "device_kv_bytes": d.get("kv_device_bytes", 0) / S, "max_running": batch[0],
        "preemptions": sum(r.preemptions for r in reqs), "off_requests": off[:8],
        "fill": fs, "run_s": time.perf_counter() - ts,
    }
    if off:  # a preempted or finished row would change what the window timed
        row["warning"] = (f"requests {off[:8]} were preempted or ended before the last timed step "
                          f"({reqs[off[0]].finish_reason}, {reqs[off[0]].preemptions} preemptions)")
        log(f"{label}: warning: {row['warning']}", style="yellow")
    if spec:
        row["acceptance"] = a.acceptance
        row["acceptance_by_position"] = [None if x is None else round(x, 4) for x in conditional_rates(eng.spec_stats)]
        if a.acceptance != "real":
            row["uncontrolled_drafts"] = eng.drafter.unknown_drafts()
            row["outputs_match_reference"] = all(reference[r.id % len(prompts)][:len(r.output_ids)] == r.output_ids
                                                 for r in reqs)
            row["verify_digest"] = eng.drafter.verify_digest()
    return row, [list(r.output_ids) for r in reqs]


def identity(rows: list[dict], outs: dict[str, list]) -> dict:
    """Per speculation setting: the policies' greedy outputs (plain) or target verify digests (forced) agree."""
    out = {}
    for spec in (False, True):
        vs = [r for r in rows if r["spec"] == spec and r["variant"] in outs]
        if len(vs) < 2:
            continue
        cmp = kl.compare_outputs({r["kv"]: outs[r["variant"]] for r in vs})
        key = "spec" if spec else "plain"
        digests = {r["kv"]: r.get("verify_digest") for r in vs}
        entry = {"outputs": cmp}
        if spec and all(v is not None for v in digests.values()):
            entry["verify_digests"] = digests
            entry["verify_identical"] = len({json.dumps(v, sort_keys=True) for v in digests.values()}) == 1
        entry["all"] = cmp["all"] and entry.get("verify_identical", True)
        out[key] = entry
    return out


# -- report -----------------------------------------------------------------------------------------------
def targets(res: dict) -> dict:
    by = {(r["load"], r["variant"]): r for r in res["rows"] if "error" not in r}

    def ratio(load, x, y):
        rx, ry = by.get((load, x)), by.get((load, y))
        ok = rx and ry and ry["decode_tokens_per_s"]
        return rx["decode_tokens_per_s"] / ry["decode_tokens_per_s"] if ok else None

    def ff(load, v):
        return by[(load, v)]["fetch_fraction"] if (load, v) in by else None
    out = {
        "adaptive_spec_over_hisparse_spec_moderate": (ratio("moderate", "adaptive+spec", "hisparse+spec"), ">= 1.4",
                                                      1.4),
        "adaptive_spec_over_adaptive_moderate": (ratio("moderate", "adaptive+spec", "adaptive"), ">= 1.25", 1.25),
        "adaptive_spec_fetch_fraction_low": (ff("low", "adaptive+spec"), "<= 0.015", -0.015),
        "adaptive_fetch_fraction_low": (ff("low", "adaptive"), "<= 0.015", -0.015),
        "adaptive_spec_over_hisparse_spec_low": (ratio("low", "adaptive+spec", "hisparse+spec"), "reported", None),
        "adaptive_spec_over_adaptive_low": (ratio("low", "adaptive+spec", "adaptive"), "reported", None),
        "hisparse_spec_over_hisparse_moderate": (ratio("moderate", "hisparse+spec", "hisparse"), "reported", None),
        "adaptive_fetch_fraction_moderate": (ff("moderate", "adaptive+spec"), "reported", None),
    }
    res_t = {}
    for k, (v, t, bound) in out.items():
        met = None if v is None or bound is None else (v >= bound if bound > 0 else v <= -bound)
        res_t[k] = {"value": v, "target": t, "met": met}
    return res_t


def table_md(res: dict) -> str:
    lines = ["| load | variant | req | pool pages (pool/demand) | decode tok/s | tokens / row-step | step ms | "
             "fetch % (fetched / selected rows) | host fetch MB/step | host fetch KB/token | H2D MB/step | "
             "demoted pages | contexts (prefilled + replayed, s) | identical |", "|" + "---|" * 14]
    order = {(ld, v): i for i, (ld, v) in enumerate((ld, v) for ld in LOADS for v in res["args"]["variants"])}
    for r in sorted(res["rows"], key=lambda r: order.get((r["load"], r["variant"]), 99)):
        ident = res["loads"][r["load"]].get("identical", {}).get("spec" if r.get("spec") else "plain", {}).get("all")
        if "error" in r:
            lines.append(f"| {r['load']} | {r['variant']} | {r.get('requests', '—')} | {r.get('num_blocks', '—')} | "
                         f"{r['error'][:90]} |" + " |" * 9)
            continue
        f = r["fill"]
        lines.append(
            f"| {r['load']} | {r['variant']} | {r['requests']} | {r['num_blocks']} "
            f"({100 * r['pool_over_demand']:.0f} %) "
            f"| {r['decode_tokens_per_s']:,.1f} | {r['tokens_per_row_step']:.2f} | {r['step_ms']:.1f} | "
            f"{100 * r['fetch_fraction']:.2f} % ({r['host_fetched_rows']:,} / {r['selected_rows']:,}) | "
            f"{r['host_fetch_bytes_per_step'] / 1e6:.1f} | {r['host_fetch_bytes_per_token'] / 1e3:.1f} | "
            f"{r['h2d_bytes_per_step'] / 1e6:.1f} | {r['demoted_pages']} | {f['real']} + {f['replayed']} "
            f"({f['real_s'] + f['replay_s']:.1f}) | {'—' if ident is None else ('yes' if ident else 'NO')} |")
    return "\n".join(lines)


def report_md(res: dict) -> str:
    a, b = res["args"], res["budget"]
    out = [f"# Long-context speculation under KV residency — {a['model']} on {res['env']['device_name']}", "",
           f"- Command: `{res['command']}`",
           f"- Commit: {res['env']['git_commit']} · torch {res['env']['torch']} · date {res['date']}",
           f"- Shape: prompt {a['prompt_len']} tokens (+ up to {res['max_tokens_spec']} decoded), top_k {a['top_k']}, "
           f"B {res['shape']['hot_buffer']}, block {a['block_size']}, indexer {res['shape']['indexer']}, "
           f"{res['shape']['layers']} layers x {res['shape']['row']} B rows (+{res['shape']['index_row']} B index "
           "keys)",
           f"- Speculation: spec=dflash2 (random drafter), γ = {a['gamma']}, acceptance {a['acceptance']} at rates "
           f"{a['rates']} (seed {a['acceptance_seed']}); {a['warmup_steps']} untimed + {a['steps']} timed engine steps "
           "with every request in the batch",
           f"- Device KV budget: **{b['bytes'] / 1e9:.3f} GB** for every variant ({b['source']}); host pool "
           f"{res['host']['arena_bytes'] / 1e9:.1f} GB {res['host']['how']}",
           f"- Contexts: {a['distinct']} distinct prompts prefilled once for real, every request seeded by replaying "
           "its prompt's prefill through the KV policy's write_prefill (benchmarks/context_fill.py)",
           *(["- Smoke run (tiny model on the CPU): checks the machinery; the figures are not measurements."]
             if a.get("smoke") else []), ""]
    for name, ld in res["loads"].items():
        ident = ld.get("identical", {})
        out.append(f"- {name}: {ld['requests']} requests; " + "; ".join(
            f"{v} pool {p['num_blocks']} pages ({100 * p['pool_over_demand']:.0f} %)" for v, p in ld["plans"].items())
            + "".join(f"; {k} identical: {e['all']}" for k, e in ident.items()))
    return "\n".join(out + kl.report_tail(res, table_md(res), 32)) + "\n"


def plot(res: dict, path: Path) -> None:
    a = res["args"]
    kl.plot_bars(res, path, LOADS, "variant", a["variants"],
                 ("decode output tokens/s", "host fetches, % of selected rows"),
                 f"{a['model']}: prompt {a['prompt_len']}, γ {a['gamma']} ({a['acceptance']}), device KV budget "
                 f"{res['budget']['bytes'] / 1e9:.3g} GB")


def write(res: dict, out: Path, with_plot: bool = False) -> None:
    kl.write(res, out, with_plot, report=(targets, report_md, plot))


# -- main -------------------------------------------------------------------------------------------------
def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default="long_spec.json",
                    help="JSON path (the .md table and .png plot go next to it)")
    ap.add_argument("--smoke", action="store_true", help="tiny_dsa on the CPU, tiny sizes (automatic without CUDA)")
    ap.add_argument("--model")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--prompt-len", type=positive_int,
                    help="prompt tokens (GPU default 32512: prompt + decoded tokens stay "
                    "within 32768, the 512-page view bucket at block 64)")
    ap.add_argument("--requests-low", type=positive_int)
    ap.add_argument("--requests-moderate", type=positive_int)
    ap.add_argument("--top-k", type=positive_int)
    ap.add_argument("--hot-buffer", type=positive_int, help="B (default 2 * top_k)")
    ap.add_argument("--block-size", type=positive_int)
    ap.add_argument("--tail-pages", type=positive_int)
    ap.add_argument("--indexer", choices=("auto", "learned", "bf16", "fp8"))
    ap.add_argument("--learned-key-dtype", choices=("fp8", "bf16"), default="fp8")
    ap.add_argument("--variants", default=VARIANTS, help="comma-separated <policy>[+spec], run in this order")
    ap.add_argument("--loads", default="moderate,low")
    ap.add_argument("--gamma", type=positive_int, help="drafts per step (spec.num_speculative_tokens)")
    ap.add_argument("--acceptance", choices=("forced", "controlled", "real"), default="forced")
    ap.add_argument("--rates", default="0.8", help="conditional acceptance per draft position, comma-separated "
                    "(one value: every position)")
    ap.add_argument("--acceptance-seed", type=int, default=0)
    ap.add_argument("--context-window", type=positive_int, default=1024,
                    help="spec.context_window (the drafter's ring)")
    ap.add_argument("--steps", type=positive_int, help="timed engine steps per variant")
    ap.add_argument("--warmup-steps", type=positive_int, help="untimed engine steps before the timed ones (>= 1)")
    ap.add_argument("--distinct", type=positive_int,
                    help="distinct prompts prefilled for real (request i holds prompt i mod "
                    "distinct)")
    ap.add_argument("--budget-gb", type=positive_float,
                    help="device KV budget in GB shared by every variant (default: the low "
                    "load's full-residency demand + --budget-margin)")
    ap.add_argument("--budget-margin", type=nonnegative_float, default=0.03)
    ap.add_argument("--host-limit-gb", type=positive_float, default=90.0,
                    help="most pinned host memory allowed (the host pool)")
    ap.add_argument("--hbm-gb", type=positive_float, default=141.0,
                    help="device memory the plan checks the total against")
    ap.add_argument("--reserve-gb", type=nonnegative_float, default=8.0,
                    help="activations, CUDA graphs, allocator slack")
    ap.add_argument("--plan-only", action="store_true", help="print the sizing and exit (no model)")
    ap.add_argument("--threads", type=positive_int)
    ap.add_argument("--deadline-s", type=positive_float, help="do not start a variant after this (s since start)")
    ap.add_argument("--hard-deadline-s", type=positive_float, help="abort a variant in flight after this")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                    help="run every variant on two short contexts first, so eager kernels (adaptive's demotion "
                    "installs) compile outside the timed windows (default off: captured steps compile inside their "
                    "capture, which decode time excludes, and --warmup-steps untimed steps precede every window)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None)
    a = ap.parse_args(argv)
    if not a.smoke and not torch.cuda.is_available() and a.device != "cuda" and not a.plan_only:
        a.smoke = True
    prof = SMOKE if a.smoke else GPU
    for k, v in prof.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.hot_buffer = a.hot_buffer or 2 * a.top_k
    try:
        a.variants = [vname(*parse_variant(v)) for v in a.variants.split(",") if v]
    except ValueError as e:
        ap.error(f"--variants: {e} is not <policy>[+spec] with policy one of {POLICIES}")
    a.loads = [ld for ld in a.loads.split(",") if ld]
    if [ld for ld in a.loads if ld not in LOADS]:
        ap.error(f"--loads: expected a subset of {LOADS}")
    given = a.rates
    try:
        rates = [float(x) for x in a.rates.split(",") if x]
    except ValueError:
        rates = []  # not numbers: refused below
    a.rates = rates * a.gamma if len(rates) == 1 else rates
    if len(a.rates) < a.gamma or not all(0 <= r <= 1 for r in a.rates):
        ap.error(f"argument --rates: invalid value {given!r}; expected one or >= --gamma {a.gamma} comma-separated "
                 "numbers in [0, 1]")
    if a.warmup_steps < 1 or a.steps < 1 or a.distinct < 1:
        ap.error("--steps, --warmup-steps and --distinct must be >= 1")
    compose_or_exit(ap, [f"model={a.model}", f"model.weights={a.weights}"],
                    {"model.weights": "--weights", "model": "--model"})
    return a


def main(argv=None) -> dict:
    return kl.run_main(parse, _main, argv)


def plan(a, arch, dsz: int) -> dict:
    """Shape, pages per request, budget and each (load, variant)'s pools."""
    n = {ld: getattr(a, f"requests_{ld}") for ld in LOADS}
    n_max = max(n.values())
    mts = max_tokens(a, True)
    ppr = kl.pages_per_request(a.prompt_len, mts + a.gamma, a.block_size)
    max_seq = a.prompt_len + mts + a.gamma + 1
    ix = a.indexer if a.indexer in ("bf16", "fp8") else "learned" if arch.index_n_heads else "bf16"
    sh = kl.Shape(layers=sum(k == "attention" for layer in arch.blocks() for k in layer), nkv=arch.num_key_value_heads,
                  head_dim=arch.head_dim, dtype_bytes=dsz, block_size=a.block_size, top_k=a.top_k,
                  hot_buffer=a.hot_buffer, indexer=ix, index_head_dim=arch.index_head_dim,
                  learned_key_dtype=a.learned_key_dtype, max_slots=n_max, max_pages=-(-max_seq // a.block_size),
                  tail_pages=a.tail_pages, cuda=a.device == "cuda")
    ring = ring_bytes_planned(a, dsz, n_max, max_seq)
    variants = [parse_variant(v) for v in a.variants]

    def args(spec):
        return (a.gamma + 1 if spec else 1, ring if spec else 0)
    need_low = max((kl.full_demand(k, sh, n["low"], ppr, *args(s)) for k, s in variants if k != "hisparse"),
                   default=kl.full_demand("adaptive", sh, n["low"], ppr))
    if a.budget_gb is not None:
        budget, source = int(a.budget_gb * 1e9), "--budget-gb"
    else:
        step = 10 ** max(0, int(math.log10(need_low)) - 2)
        budget = int(math.ceil(need_low * (1 + a.budget_margin) / step) * step)
        source = f"auto: low-load full-residency demand {need_low / 1e9:.3f} GB + {100 * a.budget_margin:.0f} %"
    plans = {ld: {vname(k, s): kl.plan_pool(k, sh, budget, n[ld], ppr, *args(s)) for k, s in variants} for ld in LOADS}
    # the reference run's policy (the first speculative variant's, plain, for the largest load that runs) shares the
    # host pool too
    n_run = max(n[ld] for ld in a.loads)
    kind0 = next((k for k, s in variants if s), None)
    ref_plan = kl.plan_pool(kind0, sh, budget, n_run, ppr) if kind0 else None
    host = max([p.get("host_bytes", 0) for ld in a.loads for p in plans[ld].values()]
               + [ref_plan.get("host_bytes", 0) if ref_plan else 0, 0])
    return {"n": n, "n_max": n_max, "ppr": ppr, "max_seq": max_seq, "shape": sh, "ring": ring, "budget": budget,
            "source": source, "plans": plans, "host_bytes": host, "max_tokens_spec": mts, "ref_plan": ref_plan,
            "ref_kind": kind0}


def check_plan(a, P: dict, weights: int, record: int) -> tuple[list[str], list[str]]:
    problems, warn = [], []
    for ld in a.loads:
        for v, p in P["plans"][ld].items():
            if p["num_blocks"] < 1:
                problems.append(f"{ld}/{v}: the budget leaves no pool pages")
            if "requests_admissible" in p and p["requests_admissible"] < P["n"][ld]:
                problems.append(f"{ld}/{v}: the pool holds only {p['requests_admissible']} of {P['n'][ld]} requests")
    if P["host_bytes"] > a.host_limit_gb * 1e9:
        problems.append(f"host pool {P['host_bytes'] / 1e9:.1f} GB over --host-limit-gb {a.host_limit_gb}")
    dev = weights + P["budget"] + record + a.reserve_gb * 1e9
    if a.device == "cuda" and dev > a.hbm_gb * 1e9:
        problems.append(f"device: weights {weights / 1e9:.1f} + KV budget {P['budget'] / 1e9:.1f} + context records "
                        f"{record / 1e9:.1f} + reserve {a.reserve_gb:.0f} = {dev / 1e9:.1f} GB over --hbm-gb "
                        f"{a.hbm_gb}")
    for v, p in P["plans"]["low"].items():
        if v.startswith("adaptive") and p["requests_fully_resident"] < P["n"]["low"]:
            warn.append(f"low load: {v} holds only {p['requests_fully_resident']} of {P['n']['low']} requests fully "
                        "resident")
    for v, p in P["plans"]["moderate"].items():
        if v.startswith("adaptive") and p["requests_fully_resident"] >= P["n"]["moderate"]:
            warn.append(f"moderate load: {v} holds every request fully resident (nothing is demoted)")
    return problems, warn


def record_bytes(a, sh, arch, dsz: int) -> int:
    """Device bytes of one distinct prompt's recorded prefill (K|V rows and index keys per layer, the drafter's
    hidden states, logits)."""
    from synodic.spec.models import num_target_blocks
    from synodic.spec.models.config import default_target_layers
    T = a.prompt_len
    ik = arch.index_head_dim * dsz if sh.indexer == "learned" else sh.nkv * sh.head_dim * dsz
    hidden = T * len(default_target_layers(num_target_blocks(arch))) * arch.hidden_size * dsz
    return sh.layers * T * (sh.row + ik) + hidden + arch.vocab_size * 4


def _main(a, argv, t0: float) -> dict:
    log = kl.Log(t0)
    out = Path(a.out)
    from synodic.config.compose import compose
    from synodic.models.weights import _shapes

    P_max = max(a.requests_low, a.requests_moderate)
    mts = max_tokens(a, True)
    cfg = compose([f"model={a.model}", f"model.weights={a.weights}", f"runtime.device={a.device}",
                   f"runtime.max_slots={P_max}", "kv=resident", f"kv.top_k={a.top_k}", "kv.num_blocks=1",
                   f"kv.block_size={a.block_size}", f"kv.indexer={a.indexer}",
                   f"kv.learned_key_dtype={a.learned_key_dtype}", f"runtime.seed={a.seed}",
                   "spec=dflash2", "spec.drafter=random", f"spec.num_speculative_tokens={a.gamma}",
                   "spec.gate=off",  # (the benchmark times speculative steps under each policy: every step drafts)
                   f"spec.context_window={a.context_window}",
                   f"runtime.overlap={ {None: 'null', True: 'true', False: 'false'}[a.overlap]}"])
    arch = cfg.model.architecture()
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.model.dtype]
    dsz = torch.empty(0, dtype=dtype).element_size()
    P = plan(a, arch, dsz)
    sh = P["shape"]
    weights_est = sum(p.numel() for p in _shapes(arch)) * dsz
    rec = record_bytes(a, sh, arch, dsz) * a.distinct
    problems, warn = check_plan(a, P, weights_est, rec)
    head = (f"budget {P['budget'] / 1e9:.3f} GB ({P['source']}); pages per request {P['ppr']} (prompt {a.prompt_len} + "
            f"up to {mts + a.gamma} tokens, max_seq {P['max_seq']}); host pool {P['host_bytes'] / 1e9:.2f} GB pinned "
            f"once; weights ~{weights_est / 1e9:.1f} GB; {a.distinct} context records {rec / 1e9:.2f} GB; drafter ring "
            f"{P['ring'] / 1e6:.1f} MB; loads {P['n']}")
    if a.plan_only:
        log(head)
        for ld in LOADS:
            for v, p in P["plans"][ld].items():
                log(f"  {ld:9s} {v:14s} " + json.dumps({k: (round(x, 4) if isinstance(x, float) else x)
                                                       for k, x in p.items() if k != "page_bytes"}))
        for w in warn:
            log(f"warning: {w}", style="yellow")
        for w in problems:
            log(f"error: {w}", style="red")
        return {"budget": P["budget"], "plans": P["plans"], "problems": problems, "warnings": warn,
                "shape": asdict(sh), "ppr": P["ppr"], "host_bytes": P["host_bytes"], "weights_estimate": weights_est,
                "record_bytes": rec}
    if problems:
        for w in problems:
            log(f"error: {w}", style="red")
        raise SystemExit(2)
    for w in warn:
        log(f"warning: {w}", style="yellow")
    from benchmarks.context_fill import ContextFill
    from synodic.engine.request import Request, SamplingParams
    from synodic.engine.workload import SyntheticWorkload, build_requests
    from synodic.graph import build_graph
    from synodic.kv.drafter_ring import drafter_ring_bytes
    from synodic.kv.rebuild import free_kv
    from synodic.results.env import environment
    from synodic.spec.controlled import reference_continuations

    res = {**kl.result_head("kv_long_spec (issue 32)", "benchmarks.kv_long_spec", a, argv, sh, P["ppr"]),
           "max_tokens_spec": mts, "max_tokens_plain": max_tokens(a, False),
           "budget": {"bytes": P["budget"], "source": P["source"]}, "loads": {}, "rows": [], "skipped": [],
           "warnings": warn, "warmup": []}
    for ld in LOADS:
        res["loads"][ld] = {"requests": P["n"][ld], "plans": P["plans"][ld]}
    log(head, style="bold")
    dev = torch.device(a.device)
    ts = time.perf_counter()
    log(f"building {a.model} ({a.weights} weights) + dflash2 (random) on {dev} ...")
    graph = build_graph(cfg, P["max_seq"], P_max)
    kl._sync(dev)
    inner = graph.spec
    res["model"] = {"kind": a.model, "params": sum(p.numel() for p in graph.model.parameters()),
                    "weight_bytes": sum(p.numel() * p.element_size() for p in graph.model.parameters()),
                    "build_s": time.perf_counter() - ts, "drafter_ring_bytes": drafter_ring_bytes(inner),
                    "drafter_ring_planned": P["ring"],
                    "drafter_params": sum(p.numel() for p in inner.model.parameters())}
    res["env"] = environment(dev)
    log(f"model built in {res['model']['build_s']:.1f}s; drafter ring "
        f"{res['model']['drafter_ring_bytes'] / 1e6:.1f} MB "
        f"(planned {P['ring'] / 1e6:.1f})")
    free_kv(graph)
    ts = time.perf_counter()
    arena, how = host_arena(max(P["host_bytes"], 1), dev)
    res["host"] = {"arena_bytes": arena.numel(), "how": how, "alloc_s": time.perf_counter() - ts}
    log(f"host pool {arena.numel() / 1e9:.2f} GB {how} in {res['host']['alloc_s']:.1f}s")
    wl = SyntheticWorkload(kind="long", num_requests=a.distinct, prompt_len=a.prompt_len, output_len=1,
                           concurrency=a.distinct, seed=a.seed)
    prompts = [r.prompt_ids for r in build_requests(wl, graph.codec, arch.vocab_size)]
    fill = ContextFill(inner.hidden_layers)
    variants = [parse_variant(v) for v in a.variants]

    # -- warm-up (--warmup): every variant on two short contexts, so eager kernels compile before any timed window
    #    (captured steps compile inside their capture, which the engine keeps out of decode time); adaptive's pool is
    #    cut to force demotions
    if a.warmup:
        from synodic.kv.rebuild import rebuild_kv
        wp = min(a.prompt_len, a.hot_buffer + 2 * a.block_size)
        wppr = kl.pages_per_request(wp, mts + a.gamma, a.block_size)
        wprompts = [p[:wp] for p in prompts[:2]]
        wref = None
        for kind, spec in variants:
            ts = time.perf_counter()
            try:
                wplan = kl.plan_pool(kind, sh, P["budget"], 2, wppr, a.gamma + 1 if spec else 1)
                if kind == "adaptive":
                    wplan["num_blocks"] = 2 * wplan["min_pages_per_request"] + 2
                if spec and wref is None and a.acceptance != "real":
                    probe = [Request(i, list(p), SamplingParams(max_tokens=mts)) for i, p in enumerate(wprompts)]
                    rebuild_kv(graph, kl.kv_config("hisparse", a, kl.plan_pool("hisparse", sh, P["budget"], 2, wppr)),
                               host_buffer=arena)
                    r = reference_continuations(graph, probe, a.gamma, on_engine=fill.install)
                    wref = [r[i] for i in range(len(probe))]
                run_variant(graph, inner, fill, arena, a, kind, spec, wplan, len(wprompts), wprompts, wref, log,
                            f"warm-up {vname(kind, spec)}", float("inf"), steps=2, warm=1)
                res["warmup"].append({"variant": vname(kind, spec), "s": time.perf_counter() - ts})
            except Exception as e:  # noqa: BLE001 - reported; the measured run shows it again
                res["warmup"].append({"variant": vname(kind, spec), "error": f"{type(e).__name__}: {e}"})
                log(f"warm-up {vname(kind, spec)} failed: {type(e).__name__}: {e}", style="red")
        log(f"warm-up done in {sum(r.get('s', 0) for r in res['warmup']):.1f}s", style="bold")

    # -- the reference continuation of every distinct prompt (plain greedy; also prefills them for real, once)
    reference = None
    if any(s for _, s in variants) and a.acceptance != "real":
        from synodic.kv.rebuild import rebuild_kv
        ts = time.perf_counter()
        probe = [Request(i, list(p), SamplingParams(max_tokens=mts)) for i, p in enumerate(prompts)]
        kind0 = P["ref_kind"]
        rebuild_kv(graph, kl.kv_config(kind0, a, P["ref_plan"]), host_buffer=arena if kind0 != "resident" else None)
        r = reference_continuations(graph, probe, a.gamma, on_engine=fill.install)
        reference = [r[i] for i in range(len(probe))]
        res["reference"] = {"s": time.perf_counter() - ts, "kv": kind0, "tokens": [len(x) for x in reference],
                            "prefill": dict(fill.stats), "record_bytes": fill.nbytes()}
        log(f"reference: {len(prompts)} prompts prefilled ({fill.stats['real_s']:.1f}s) and decoded greedily to "
            f"{len(reference[0])} tokens in {res['reference']['s']:.1f}s; records {fill.nbytes() / 1e9:.2f} GB")
    write(res, out)

    # -- measured runs
    for ld in a.loads:
        outs: dict[str, list] = {}
        for kind, spec in variants:
            v = vname(kind, spec)
            label = f"{ld} · {v}"
            if log.now() > a.deadline_s:
                msg = f"{label}: skipped at {log.now():.0f}s (--deadline-s {a.deadline_s:.0f})"
                log(msg, style="yellow")
                res["skipped"].append(msg)
                continue
            p = P["plans"][ld][v]
            log(f"── {label}: {P['n'][ld]} requests, pool {p['num_blocks']} pages ({100 * p['pool_over_demand']:.0f} % "
                f"of full residency)", style="bold cyan")
            base = {"load": ld, "variant": v, "kv": kind, "spec": spec, "requests": P["n"][ld],
                    "num_blocks": p["num_blocks"]}
            try:
                row, o = run_variant(graph, inner, fill, arena, a, kind, spec, p, P["n"][ld], prompts, reference, log,
                                     label, a.hard_deadline_s)
                row = {**base, **row}
                outs[v] = o
                log(f"{label}: {row['decode_tokens_per_s']:,.1f} tok/s · {row['tokens_per_row_step']:.2f} "
                    "tokens/row-step "
                    f"· step {row['step_ms']:.1f} ms · fetch {100 * row['fetch_fraction']:.2f} % · "
                    f"{row['host_fetch_bytes_per_step'] / 1e6:.1f} MB/step · demoted {row['demoted_pages']}",
                    style="green")
            except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
                row = kl.failed_row(graph, base, e, log, label)
            res["rows"].append(row)
            res["loads"][ld]["identical"] = identity([r for r in res["rows"] if r["load"] == ld and "error" not in r],
                                                     outs)
            write(res, out)
        for key, e in res["loads"][ld].get("identical", {}).items():
            log(f"{ld}: {key} variants identical across policies: {e['all']}", style="green" if e["all"] else "yellow")
    free_kv(graph)
    res["fill"] = dict(fill.stats)
    write(res, out, with_plot=True)
    log.text(report_md(res))
    log(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}", style="bold")
    return res


if __name__ == "__main__":
    main()
