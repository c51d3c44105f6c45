"""pipeline=bench: decode throughput over batch sizes for one or more variants, side by side in one
process (same inputs), as a markdown + CSV table and a plot in the run dir.

Every point is served by the engine itself (synodic.engine.engine.Engine.generate: overlapped steps, CUDA
graphs, speculative steps, the KV policy's hooks, the byte ledger), so what bench times is what
pipeline=decode serves; the bench only chooses the requests, when they join, and which steps it times
(docs/measuring.md, "End to end").

The points run on the runtime's replicas (`cfg.runtime.executor(cfg).workers()`): runtime=local is this
process, runtime=ray N Ray actors that each time every point at once. Under data parallelism `batch` is per
replica: each replica serves `batch` concurrent requests (the same seeded prompts as a local run), and the
combined row sums the replicas' tokens/s, GB/s and ledger bytes, with step_ms the slowest replica's; results
gain `replicas` (each one's device, requests, tokens/s and rows) and bench_replicas.csv (docs/measuring.md,
"Data-parallel replicas")."""
import logging
import re
import statistics
import time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from synodic.config.registry import Component, register

log = logging.getLogger(__name__)
SPREAD_WARN = 0.10  # median over min step time above which a point's repeats are reported as disagreeing

_Rate = Annotated[float, Field(ge=0.0, le=1.0)]


@register("pipeline")
class BenchPipeline(Component):
    kind: Literal["bench"] = "bench"
    batch_sizes: list[Annotated[int, Field(ge=1)]] = Field([1, 4, 16], min_length=1,
                                                         description="decode batch sizes to time")
    variants: list[str] = Field([""], min_length=1, description="override strings, one per variant, "
                                "applied on top of the run's overrides ('' = the run's own config)")
    prompt_len: int = Field(32, ge=1, description="prompt tokens per sequence before timing")
    steps: int = Field(16, ge=1, description="timed decode steps per point")
    warmup: int = Field(2, ge=0, description="untimed decode steps first (graph capture, autotune); the timer "
                        "starts at a step's read-back, so with stagger <= 1 and warmup 0 one untimed step runs")
    stagger: int = Field(16, ge=0, description="rows join over this many untimed steps first (row s after s mod "
                         "stagger steps), so positions and replay cursors are spread as when requests arrive over "
                         "time; 0 or 1: every row starts together (replay then flushes every row on the same step)")
    repeats: int = Field(3, ge=1, description="times each point is served and timed (fresh requests each); "
                         "step_ms is the median, step_ms_min the fastest, and a warning is printed and recorded "
                         "when they differ by more than 10 %")
    profile: bool = Field(False, description="after all timings, per variant at the largest batch: 3 "
                          "uncaptured steps under torch.profiler, per-kernel time table in profile_<variant #>.txt "
                          "(where the step's time goes)")
    acceptance: Literal["real", "controlled", "forced"] = Field(
        "real", description="speculative variants: real = the drafter's own proposals; controlled = the drafter "
        "runs (its full cost) but its proposals are replaced by the target's greedy continuation rejected at "
        "acceptance_rates (synodic/spec/controlled.py; for random-weight presets, which accept nothing); "
        "forced = controlled, and the verify's decision is replaced by the draws too (random-weight bf16 "
        "presets, whose near-tie argmax differs between a verify window and a decode step)")
    acceptance_rates: list[_Rate] | None = Field(
        None, description="controlled: conditional acceptance per draft position (kept at k given 1..k-1 kept), "
        "at least γ of them; null = measured_rates[<spec scheme>]")
    measured_rates: dict[str, list[_Rate]] = Field(
        {}, description="per spec scheme, the conditional acceptance by draft position measured on the embedded "
        "models (conf/pipeline/bench.yaml holds them and their source): controlled acceptance's default")
    acceptance_seed: int = Field(0, description="controlled: seed of the acceptance draws (same seed, same "
                                 "requests: the same drafts accepted)")
    memory_budget: int | None = Field(None, ge=1, description="device bytes: per variant, how many requests fit "
                                      "(weights once; per request SSM state slot, KV pages, drafter ring) and "
                                      "the decode throughput at that admission (admission.md)")
    max_admitted: int = Field(256, ge=1, description="memory_budget: the largest batch timed at the admission "
                              "(the admitted count itself is reported uncapped)")

    @model_validator(mode="after")
    def _rates_need_control(self):
        if self.acceptance == "real" and self.acceptance_rates is not None:
            raise ValueError(f"pipeline.acceptance_rates={self.acceptance_rates} with pipeline.acceptance=real: "
                             "expected pipeline.acceptance=controlled or forced (real acceptance is the drafter's "
                             "own), or no pipeline.acceptance_rates")
        return self


def _task_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        return [o for o in HydraConfig.get().overrides.task if not o.startswith("pipeline")]
    except ValueError:  # not under a Hydra job
        return []


def _gamma(graph) -> int:
    return getattr(graph.cfg.spec, "num_speculative_tokens", 0) if graph.spec is not None else 0


def _phases(p: BenchPipeline) -> tuple[int, int]:
    """(stagger steps, untimed steps after them): the timer starts at the read-back of the last untimed step."""
    S = p.stagger if p.stagger > 1 else 0
    return S, p.warmup if S + p.warmup > 0 else 1


def row_tokens(p: BenchPipeline, window: int = 1) -> int:
    """Tokens a row may hold by the end of a point (prompt, every step's window, one spare step)."""
    S, W = _phases(p)
    return p.prompt_len + (S + W + p.steps + 2) * window


def bench_requests(graph, b: int, p: BenchPipeline):
    """b greedy requests on seeded random prompts (the same for every variant at batch b), the step each joins
    at, and each one's max_tokens: a plain row ends exactly at the last timed step; a speculative row (up to
    1 + γ tokens a step) cannot end before it (the bench stops the engine there)."""
    import torch

    from synodic.engine.request import Request, SamplingParams

    gen = torch.Generator().manual_seed(b)
    vocab = graph.model.config.vocab_size
    prompts = [torch.randint(0, vocab, (p.prompt_len,), generator=gen).tolist() for _ in range(b)]
    S, W = _phases(p)
    T = _gamma(graph) + 1
    joins = [s % S if S else 0 for s in range(b)]
    steps = [S - j + W + p.steps for j in joins]  # decode steps row s is in, through the last timed one
    max_tokens = [1 + n if T == 1 else 1 + (n + 1) * T for n in steps]
    reqs = [Request(s, prompts[s], SamplingParams(max_tokens=m)) for s, m in enumerate(max_tokens)]
    return reqs, joins


def _check_pages(graph, b: int, p: BenchPipeline) -> None:
    """Every row holds its pages for the whole point: checked before any prefill (a preemption would change
    what is timed)."""
    if graph.kv is None:
        return
    blocks, T = graph.kv.blocks, _gamma(graph) + 1
    total = row_tokens(p, T)
    need = b * blocks.blocks_for(total)
    if need > blocks.num_blocks:
        from synodic.config.errors import ConfigError
        what = "stagger + warmup + steps + 2" if T == 1 else f"(stagger + warmup + steps + 2) x {T}"
        raise ConfigError([f"kv.num_blocks={blocks.num_blocks}: batch {b} x {total} tokens (prompt_len + {what}) "
                           f"needs {need} pages of {blocks.block_size}; expected kv.num_blocks >= {need} or "
                           f"{'a shorter pipeline.prompt_len' if p.prompt_len >= p.steps else 'fewer pipeline.steps'}"])


def reference_outputs(graph, b: int, p: BenchPipeline) -> dict[int, list[int]]:
    """The target's greedy continuation of the point's requests: a plain (non-speculative) engine run over the
    same graph, γ tokens longer than a speculative row can emit. Controlled acceptance drafts from it."""
    from synodic.spec.controlled import reference_continuations

    _check_pages(graph, b, p)
    reqs, _ = bench_requests(graph, b, p)
    # a row proposes with at most max_tokens - 1 outputs: drafts up to index max_tokens + γ - 2
    return reference_continuations(graph, reqs, _gamma(graph))


def _rates(graph, p: BenchPipeline) -> list[float]:
    from synodic.config.errors import ConfigError
    scheme = graph.cfg.spec.kind
    rates = p.acceptance_rates if p.acceptance_rates is not None else p.measured_rates.get(scheme)
    if rates is None:
        raise ConfigError([f"pipeline.acceptance_rates=None with spec={scheme}: pipeline.measured_rates has "
                           f"{sorted(p.measured_rates) or 'no schemes'}; expected pipeline.acceptance_rates=[...] "
                           f"(one per draft position)"])
    if len(rates) < _gamma(graph):
        raise ConfigError([f"pipeline.acceptance_rates={rates}: {len(rates)} rates for "
                           f"spec.num_speculative_tokens={_gamma(graph)}; expected at least {_gamma(graph)}"])
    return list(rates[:_gamma(graph)])


def time_point(graph, b: int, p: BenchPipeline, profile_path: Path | None = None,
               reference: dict[int, list[int]] | None = None) -> dict:
    """Serve b requests through the engine: rows join over p.stagger untimed steps (synced steps, as
    admissions are in serving), p.warmup more untimed steps, then p.steps timed ones, all through
    Engine.generate. Times, bytes (the engine's own ledger) and tokens are the differences between the
    engine's counters at the read-backs of the last untimed and the last timed step; CUDA-graph capture time
    inside the window is excluded, as the engine excludes it from decode_s. Speculative variants end with
    Engine.stop at the last timed step; with p.acceptance controlled or forced the drafter is wrapped
    (synodic.spec.controlled) and drafts from `reference` (reference_outputs by default)."""
    from synodic.engine.engine import Engine
    from synodic.spec.controlled import ControlledDrafter, conditional_rates

    _check_pages(graph, b, p)
    G = _gamma(graph)
    controlled = p.acceptance in ("controlled", "forced") and graph.spec is not None
    if controlled and reference is None:
        reference = reference_outputs(graph, b, p)
    reqs, joins = bench_requests(graph, b, p)
    spec, cuda_graphs = graph.spec, graph.cuda_graphs
    if controlled:
        graph.spec = ControlledDrafter(spec, G, _rates(graph, p), reference, graph.model.config.vocab_size,
                                       p.acceptance_seed, graph.max_slots, graph.max_seq_len, graph.device,
                                       force=p.acceptance == "forced")
    if profile_path is not None:
        graph.cuda_graphs = False  # kernels visible one by one
    try:
        eng = Engine(graph)
    finally:
        graph.spec, graph.cuda_graphs = spec, cuda_graphs
    S, W = _phases(p)
    k0, k1 = S + W - 1, S + W - 1 + p.steps  # ticks (0-based step read-backs) opening and closing the window
    later: dict[int, list] = {}
    for r, j in zip(reqs, joins):
        later.setdefault(j, []).append(r)
    first = later.pop(0)
    overlap = eng.overlap
    if later:  # joins need the host between steps: synced until the last one is queued
        eng.overlap = False
    last_join = max(later, default=0)
    marks: dict[int, tuple] = {}
    tick = [-1]
    prof = None
    if profile_path is not None:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if graph.device.type == "cuda" else [])
        prof = profile(activities=acts)

    def snap():  # at a read-back: that step is done; in overlap mode the next one is queued (not waited for)
        st = eng.spec_stats
        return (time.perf_counter(), eng.runner.capture_s, dict(eng.ledger.totals), eng.ledger.tokens, st.emitted,
                st.plain_steps)

    def progress(_live: int) -> None:
        k = tick[0] = tick[0] + 1
        if k + 1 in later:  # these rows join at the next step
            now = time.perf_counter()
            for r in later[k + 1]:
                r.arrival_s = now
                eng.scheduler.add(r)
            if k + 1 == last_join:
                eng.overlap = overlap
        if k == k0:
            marks[0] = snap()
            if prof is not None:
                prof.start()
        elif k == k1:
            if prof is not None:
                prof.stop()
            marks[1] = snap()
            if G:
                eng.stop("bench_end")

    eng.generate(first, progress=progress)
    if 1 not in marks:
        raise RuntimeError(f"bench: the engine ran {tick[0] + 1} steps at batch {b}, expected {k1 + 1}")
    off = [r.id for r in reqs if r.preemptions or r.finish_reason not in ("length", "bench_end")]
    if off:
        raise RuntimeError(f"bench: requests {off[:8]} at batch {b} were preempted or ended early "
                           f"({reqs[off[0]].finish_reason}); the point would not time {b} rows")
    (t0, c0, L0, n0, e0, q0), (t1, c1, L1, n1, e1, q1) = marks[0], marks[1]
    step_s = (t1 - t0 - (c1 - c0)) / p.steps
    tokens = (e1 - e0) if G else (n1 - n0)
    bytes_ = {k: (L1[k] - L0.get(k, 0)) / p.steps for k in L1}
    moved = sum(v for k, v in bytes_.items() if not k.startswith("kv_") or k in ("kv_device_read",))
    moved -= bytes_.get("kv_selected_rows", 0) + bytes_.get("kv_host_fetched_rows", 0)
    row = {"batch": b, "step_ms": 1e3 * step_s, "tokens_per_s": tokens / p.steps / step_s, "bytes_per_step": moved,
           "GB_per_s": moved / step_s / 1e9, **{f"bytes_{k}": v for k, v in bytes_.items()},
           "outputs_sha1": outputs_digest(reqs)}
    if G:
        row["tokens_per_row_step"] = tokens / p.steps / b
        # timed steps that did not draft: the gate's choice (spec.gate=auto), past spec.max_batch, or no drafts
        row["plain_steps"] = q1 - q0
        row["acceptance"] = p.acceptance if controlled else "real"
        row["acceptance_by_position"] = [None if x is None else round(x, 4)
                                         for x in conditional_rates(eng.spec_stats)]
        if controlled:
            row["outputs_match_reference"] = all(reference[r.id][:len(r.output_ids)] == r.output_ids for r in reqs)
            row["uncontrolled_drafts"] = eng.drafter.unknown_drafts()
    if prof is not None:
        key = "self_cuda_time_total" if graph.device.type == "cuda" else "self_cpu_time_total"
        profile_path.write_text(f"batch {b}, {p.steps} uncaptured decode steps\n" + prof.key_averages().table(
            sort_by=key, row_limit=40, max_name_column_width=80))
    return row


def outputs_digest(reqs) -> str:
    """sha1 of a point's tokens (every request's outputs, by id): two greedy runs of a point (repeats, replicas,
    runtimes) that decoded the same tokens have the same digest."""
    import hashlib
    import json
    return hashlib.sha1(json.dumps([r.output_ids for r in sorted(reqs, key=lambda r: r.id)]).encode()).hexdigest()


def combine_repeats(reps: list[dict]) -> dict:
    """One row from a point's repeats: step_ms the median (tokens/s and GB/s from it), step_ms_min the
    fastest, spread = median / min - 1; `warning` when the spread exceeds 10 %."""
    ms = [r["step_ms"] for r in reps]
    med, lo = statistics.median(ms), min(ms)
    # bytes and tokens per step are the same in every repeat (same requests, greedy), unless a speculative gate
    # (spec.gate=auto) drafted in different steps of different repeats: then the row is the median repeat's
    out = dict(reps[0])
    if len({(round(r["tokens_per_s"] * r["step_ms"], 6), r.get("plain_steps")) for r in reps}) > 1:
        out = dict(sorted(reps, key=lambda r: r["step_ms"])[(len(reps) - 1) // 2])
        med = out["step_ms"]
    per_step = out["tokens_per_s"] * out["step_ms"] / 1e3
    out.update(step_ms=med, tokens_per_s=per_step / (med / 1e3), GB_per_s=out["bytes_per_step"] / (med / 1e3) / 1e9,
               step_ms_min=lo, step_ms_median=med, repeats=len(reps), spread=med / lo - 1 if lo > 0 else 0.0)
    if out["spread"] > SPREAD_WARN:
        out["warning"] = (f"batch {out['batch']}: median {med:.3f} ms/step vs min {lo:.3f} ms ({out['spread']:.0%} "
                          f"apart, > {SPREAD_WARN:.0%}): noisy timings, rerun or raise pipeline.steps")
    return out


def _kv_pages(kv, tokens: int) -> tuple[int, int, int]:
    """(device-pool pages, pages outside the pool, bytes of a page over every attention layer) one request
    holds: resident every page of its context; hisparse its hot buffer (pool) and draft pages (outside);
    adaptive at its floor under pressure (demoted: hot-buffer and tail pages, or its whole context if fewer)."""
    if hasattr(kv, "k"):  # resident: K and V pages of every attention layer
        return kv.blocks.blocks_for(tokens), 0, sum(t[0].numel() * t.element_size() for t in [*kv.k, *kv.v])
    page = sum(t[0].numel() * t.element_size() for t in kv.kv)
    if hasattr(kv, "DP"):  # hisparse
        return kv.HP, kv.DP, page
    return min(-(-tokens // kv.bs), kv.HPA + kv.tail), 0, page


def slot_bytes(graph, tokens: int) -> dict[str, int]:
    """Device bytes one request holds at `tokens` context tokens, from the graph's own layouts: the SSM
    backend's slot (replay: checkpoint, its low-precision copy and the ring of ring_len inputs, the backend's
    ledger constants, plus the cursor; eager: its state buffers, 1 + γ of them when it verifies windows; both:
    the conv window), the KV pages the policy gives it (_kv_pages) and the neural drafter's context ring."""
    out = {}
    ssm = graph.ssm
    if ssm is not None:
        conv = ssm._conv_row_bytes
        if hasattr(ssm, "_CK"):  # replay
            out["ssm"] = ssm._CK + ssm._LO + ssm._E * ssm.L + ssm.write_pos.element_size() + conv
        else:  # eager: state rows max_slots * W
            out["ssm"] = ssm.W * sum(s[0].numel() * s.element_size() for s in ssm.state) + conv
    if graph.kv is not None:
        pool, extra, page = _kv_pages(graph.kv, tokens)
        out["kv"] = (pool + extra) * page
    ring = getattr(getattr(graph.spec, "model", None), "_ring", None)
    if ring is not None:
        out["draft_ring"] = sum(t[0].numel() * t.element_size() for t in [*ring["k"], *ring["v"]])
    return out


def weights_bytes(graph) -> int:
    """Parameters + buffers of the target and the drafter (a quantized model's packed codes, and its dense
    copies when quant.dense_copy keeps them)."""
    mods = [graph.model] + ([graph.spec.model] if hasattr(graph.spec, "model") else [])
    tensors = {id(t): t for m in mods for t in [*m.parameters(), *m.buffers()]}.values()
    return sum(t.numel() * t.element_size() for t in tensors)


def admission(graph, p: BenchPipeline) -> dict:
    """Requests a device memory budget of p.memory_budget bytes admits: (budget - weights) // bytes a request."""
    tokens = row_tokens(p, _gamma(graph) + 1)
    per = slot_bytes(graph, tokens)
    w = weights_bytes(graph)
    total = sum(per.values())
    return {"memory_budget": p.memory_budget, "weights_bytes": w, "request_bytes": per,
            "request_bytes_total": total, "context_tokens": tokens,
            "admitted": max(0, (p.memory_budget - w) // total) if total else None}


def budget_graph(vcfg, pool_pages: int | None, admitted: int, max_len: int):
    """The variant rebuilt for `admitted` rows: max_slots = admitted and the device KV pool exactly the pages
    the admitted requests hold (pool_pages each, from _kv_pages), so the policy runs as at that budget."""
    from synodic.graph import build_graph
    cfg = vcfg
    if pool_pages is not None:
        cfg = vcfg.model_copy(update={"kv": vcfg.kv.model_copy(update={"num_blocks": admitted * pool_pages})})
    return build_graph(cfg, max_len, max_slots=admitted)


# Replica-side steps of the bench: each runs on every replica of the runtime's executor (LocalWorkers: this
# process; RayWorkers: one Ray actor per replica), `state` holding that replica's graph between calls.

def _w_build(state: dict, raw: dict, max_len: int, max_slots: int) -> dict:
    """The variant's graph on this replica (the previous variant's freed first); its device and weights."""
    from synodic.config.schema import validate
    from synodic.graph import build_graph
    state.clear()
    state["graph"] = graph = build_graph(validate(raw), max_len, max_slots=max_slots)
    # what the weights occupy (parameters + buffers: a quantized model's packed codes, and its dense copies when
    # quant.dense_copy keeps them)
    tensors = {id(t): t for t in [*graph.model.parameters(), *graph.model.buffers()]}.values()
    return {"device": str(graph.device),
            "model_GiB": round(sum(t.numel() * t.element_size() for t in tensors) / 2**30, 3)}


def _w_reference(state: dict, b: int, p: BenchPipeline) -> None:
    graph = state["graph"]
    state["reference"] = reference_outputs(graph, b, p) if graph.spec is not None else None


def _w_time(state: dict, b: int, p: BenchPipeline) -> dict:
    return time_point(state["graph"], b, p, reference=state.get("reference"))


def _w_admission(state: dict, p: BenchPipeline) -> tuple[dict, int | None]:
    graph = state["graph"]
    adm = admission(graph, p)
    pool = _kv_pages(graph.kv, adm["context_tokens"])[0] if graph.kv is not None else None
    return adm, pool


def _w_budget(state: dict, raw: dict, pool: int | None, admitted: int, max_len: int) -> None:
    from synodic.config.schema import validate
    state.clear()
    state["graph"] = budget_graph(validate(raw), pool, admitted, max_len)


def _w_profile(state: dict, raw: dict, max_len: int, b: int, quick: BenchPipeline) -> str:
    import tempfile

    from synodic.config.schema import validate
    from synodic.graph import build_graph
    state.clear()
    graph = build_graph(validate(raw), max_len, max_slots=b)
    with tempfile.TemporaryDirectory() as d:  # written where the replica runs, returned as text
        path = Path(d) / "profile.txt"
        time_point(graph, b, quick, path)
        return path.read_text()


def _w_drop(state: dict) -> None:
    state.clear()


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def combine_replicas(rows: list[dict]) -> dict:
    """One point's row over data-parallel replicas, each of which served the point's `batch` requests at once (the
    calls start together, so their timed windows overlap): tokens/s, bytes per step (every ledger column) and GB/s
    are the sums of the replicas' (the combined ledger is the sum of theirs); step_ms and its repeats' figures are
    the slowest replica's; acceptance is the replicas' mean. One replica: its row as it is."""
    if len(rows) == 1:
        return dict(rows[0])
    out = dict(max(rows, key=lambda r: r["step_ms"]))
    for k in rows[0]:
        if k in ("tokens_per_s", "GB_per_s", "uncontrolled_drafts") or k.startswith("bytes_"):
            out[k] = sum(r[k] for r in rows)
    if "tokens_per_row_step" in out:
        out["tokens_per_row_step"] = _mean([r["tokens_per_row_step"] for r in rows])
        out["plain_steps"] = max(r["plain_steps"] for r in rows)
        out["acceptance_by_position"] = [_mean(list(xs)) for xs in zip(*(r["acceptance_by_position"] for r in rows))]
    if "outputs_match_reference" in out:
        out["outputs_match_reference"] = all(r["outputs_match_reference"] for r in rows)
    shas = {r["outputs_sha1"] for r in rows}
    out["outputs_sha1"] = shas.pop() if len(shas) == 1 else None  # None: the replicas decoded different tokens
    out.update(replicas=len(rows), batch_total=rows[0]["batch"] * len(rows))
    out.pop("warning", None)
    return out


PLACEMENT = ("kind", "replicas", "gpus_per_replica", "cpus_per_replica", "address", "router", "max_restarts")


def _compose_variants(cfg, base: list[str]) -> list:
    """Each variant's config (the run's overrides, then the variant's); every bad variant is one line naming it
    (Hydra's and the schema's errors alike), raised together before anything runs."""
    from synodic.config.compose import compose
    from synodic.config.errors import ConfigError
    from synodic.config.hydra_errors import format_hydra_error
    vcfgs, bad = [], []
    for i, v in enumerate(cfg.pipeline.variants):
        where = f"pipeline.variants[{i}]={v!r}"
        # every variant runs under this bench, whose requests are its own: pipeline and workload overrides there
        # would be silently ignored
        own = [o for o in v.split() if _group(o) in ("pipeline", "workload")]
        if own:
            bad.append(f"{where}: sets {' '.join(own)}; expected variants of what is timed (model, ssm, kv, spec, "
                       f"quant, runtime), with pipeline.* set on the command line (the bench's requests are "
                       f"pipeline.prompt_len, batch_sizes and steps, not the workload's)")
            continue
        if v.split() in [u.split() for u in cfg.pipeline.variants[:i]]:
            bad.append(f"{where}: the same overrides as an earlier variant; expected distinct variants (each is a "
                       f"row of the table)")
            continue
        try:
            vcfgs.append(compose(base + v.split()) if v else cfg)
        except ConfigError as e:
            bad += [f"{where}: {line}" for line in e.lines]
        except Exception as e:  # noqa: BLE001 - Hydra's own errors (unknown option, grammar) for this variant
            bad += [f"{where}: {line}" for line in format_hydra_error(e, v.split())]
    if bad:
        raise ConfigError(bad)
    return vcfgs


def _group(override: str) -> str:
    """The config group an override string sets (`+kv.top_k=8` → kv)."""
    return re.split(r"[.=@]", override.lstrip("+~"), maxsplit=1)[0]


def _check_variants(cfg, vcfgs) -> None:
    """The replicas are started once for every variant: a variant may change what each replica builds (model,
    ssm, kv, spec, quant, runtime.device, max_slots, ...), not where or how many replicas run."""
    from synodic.config.errors import ConfigError
    bad = []
    for i, (v, vcfg) in enumerate(zip(cfg.pipeline.variants, vcfgs)):
        diff = [k for k in PLACEMENT if getattr(vcfg.runtime, k, None) != getattr(cfg.runtime, k, None)]
        if diff:
            bad.append(f"pipeline.variants[{i}]={v!r}: changes runtime.{', runtime.'.join(diff)}; expected variants "
                       f"that keep runtime={cfg.runtime.kind}'s placement (one set of replicas serves every variant)")
    if bad:
        raise ConfigError(bad)


def run(cfg, run_dir: Path) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from synodic.results.writer import markdown_table

    p = cfg.pipeline
    con = Console()
    base = _task_overrides()
    vcfgs = _compose_variants(cfg, base)
    unused = [o for o in base if _group(o) == "workload"]
    if unused:
        from synodic.config.files import note
        note(f"{' '.join(unused)}: pipeline=bench serves its own requests (pipeline.prompt_len, batch_sizes, steps); "
             "the workload group is not used")
    if p.acceptance != "real" and all(c.spec.kind == "none" for c in vcfgs):
        from synodic.config.errors import ConfigError
        raise ConfigError([f"pipeline.acceptance={p.acceptance!r}: no variant speculates (every spec=none); expected "
                           "a variant with spec=<scheme> or pipeline.acceptance=real"])
    _check_variants(cfg, vcfgs)  # before any replica starts
    rows, warnings, admissions = [], [], []
    points = len(p.variants) * (len(p.batch_sizes) + (p.memory_budget is not None)) * p.repeats
    bar = Progress(TextColumn("bench {task.description:>40}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=con)

    with cfg.runtime.executor(cfg).workers() as w, bar:
        task = bar.add_task("", total=points)
        per_replica = [{"replica": k, "pid": w.pids[k], "device": None, "requests": 0, "bench": []}
                       for k in range(w.n)]

        def point(name: str, b: int, extra: dict) -> dict:
            if p.acceptance != "real":  # one reference run (per replica) serves every repeat
                bar.update(task, description=f"{name} b={b} reference")
                w.call(_w_reference, b, p)
            reps = []
            for i in range(p.repeats):
                bar.update(task, description=f"{name} b={b} #{i + 1}")
                reps.append(w.call(_w_time, b, p))  # [replica 0's row, replica 1's, ...]
                bar.advance(task)
            mine = [combine_repeats([rep[k] for rep in reps]) for k in range(w.n)]
            ws = []
            for k, m in enumerate(mine):
                per_replica[k]["requests"] += b * p.repeats
                per_replica[k]["bench"].append({"variant": name, **m, **extra})
                if "warning" in m:
                    ws.append(m["warning"] if w.n == 1 else f"replica {k}, {m['warning']}")
            r = {"variant": name, **combine_replicas(mine), **extra}
            if ws:
                r["warning"] = "; ".join(ws)
            msg = (f"{name:>30} batch {b:>4}{f' x {w.n} replicas' if w.distributed else ''}: {r['step_ms']:.3f} "
                   f"ms/step (min {r['step_ms_min']:.3f}), {r['tokens_per_s']:.0f} tok/s, {r['GB_per_s']:.1f} GB/s")
            if "acceptance" in r:
                msg += f", {r['tokens_per_row_step']:.2f} tokens/row/step ({r['acceptance']} acceptance)"
            con.print(msg)
            log.info(msg)
            if "warning" in r:
                wn = f"{name}, {r.pop('warning')}"
                r["warning"] = wn
                warnings.append(wn)
                con.print(f"[yellow]warning: {wn}[/yellow]")
                log.warning(wn)
            return r

        failed, current = None, None  # (variant, error) that stopped the run after some points were timed
        try:
            for i, (v, vcfg) in enumerate(zip(p.variants, vcfgs)):
                name = v or "base"
                current = f"pipeline.variants[{i}]={v!r}"
                raw = vcfg.model_dump(mode="json")
                max_len = row_tokens(p, vcfg.spec.window) + 1
                built = w.call(_w_build, raw, max_len, max(p.batch_sizes))
                for k, info in enumerate(built):
                    per_replica[k]["device"] = info["device"]
                model_gib = built[0]["model_GiB"]
                for b in p.batch_sizes:
                    rows.append(point(name, b, {"model_GiB": model_gib}))
                if p.memory_budget is not None:
                    # admission is worked out from the graph's layouts, the same on every replica: replica 0's
                    adm, pool = w.call(_w_admission, p)[0]
                    adm = {"variant": name, **adm}
                    admissions.append(adm)
                    n = adm["admitted"]
                    con.print(f"{name:>30} budget {p.memory_budget / 2**30:.3f} GiB: weights "
                              f"{adm['weights_bytes'] / 2**30:.3f} GiB, {adm['request_bytes_total']} B a request "
                              f"({', '.join(f'{k} {x}' for k, x in adm['request_bytes'].items())}) -> {n} admitted")
                    if n:
                        nb = min(n, p.max_admitted)
                        w.call(_w_budget, raw, pool, nb, max_len)
                        r = point(name, nb, {"model_GiB": model_gib, "memory_budget": p.memory_budget, "admitted": n})
                        adm.update(batch_timed=nb, tokens_per_s=r["tokens_per_s"], step_ms=r["step_ms"])
                        rows.append(r)
                    else:
                        bar.advance(task, p.repeats)
            if p.profile:  # a separate pass: a profiler session can slow the CUDA-graph timings that follow it
                current = "pipeline.profile"
                quick = p.model_copy(update={"steps": 3, "warmup": 1, "repeats": 1})
                for i, vcfg in enumerate(vcfgs):
                    texts = w.call(_w_profile, vcfg.model_dump(mode="json"), row_tokens(quick, vcfg.spec.window) + 1,
                                   max(p.batch_sizes), quick)
                    for k, text in enumerate(texts):
                        (run_dir / (f"profile_{i}.txt" if w.n == 1 else f"profile_{i}_replica{k}.txt")).write_text(text)
        except Exception as e:
            if not rows:  # nothing timed yet: nothing to keep
                raise
            failed = (current, e)
        else:
            w.call(_w_drop)
    cols = ["variant", "batch", "step_ms", "step_ms_min", "tokens_per_s", "bytes_per_step", "GB_per_s", "model_GiB"]
    if w.distributed:
        cols[2:2] = ["replicas", "batch_total"]
    if any("acceptance" in r for r in rows):
        cols += ["tokens_per_row_step", "plain_steps", "acceptance"]
    if admissions:
        cols += ["admitted"]
    if failed is not None:  # the points timed so far are written as usual, and the tables say what is missing
        why = _one_line(failed[1])
        warnings.append(f"incomplete: {failed[0]} failed ({why}); the rows are the points timed before it")
    # a failed rerun writes beside an earlier complete run's files, not over them
    from synodic.results.writer import partial_dir
    dest = run_dir if failed is None else partial_dir(run_dir)
    md = markdown_table(rows, cols)
    (dest / "bench.md").write_text(md + "\n" + "".join(f"\nwarning: {x}" for x in warnings) + "\n")
    _write_csv(rows, dest / "bench.csv")
    _plot(rows, dest / "bench.png")
    con.print(md)
    out = {"bench": rows, "metrics": {"decode_tokens_per_s": max(r["tokens_per_s"] for r in rows)},
           "warnings": warnings, "acceptance": p.acceptance}
    if w.distributed:  # runtime=ray: each replica's device, requests served, its rows (tokens/s, bytes per step)
        for rep in per_replica:
            rep["tokens_per_s"] = max(r["tokens_per_s"] for r in rep["bench"])
        out["replicas"] = per_replica
        _write_csv([{"replica": rep["replica"], "device": rep["device"], **r} for rep in per_replica
                    for r in rep["bench"]], dest / "bench_replicas.csv")
    if p.acceptance != "real":
        con.print(f"[bold]acceptance: {p.acceptance}[/bold] (speculative rows draft the target's greedy "
                  "continuation rejected at pipeline.acceptance_rates; not the drafter's own acceptance"
                  + ("; the verify's decision forced to the draws" if p.acceptance == "forced" else "") + ")")
    if admissions:
        acols = ["variant", "memory_budget", "weights_bytes", "request_bytes_total", "admitted", "batch_timed",
                 "tokens_per_s"]
        amd = markdown_table(admissions, acols)
        (dest / "admission.md").write_text(amd + "\n")
        con.print(amd)
        out["admission"] = admissions
    for x in warnings:
        con.print(f"[yellow]warning: {x}[/yellow]")
    if failed is not None:
        from synodic.config.errors import ConfigError, PartialResults
        out["incomplete"] = {"at": failed[0], "error": why}
        cause = failed[1]
        if isinstance(cause, ConfigError):  # the one-line error names the variant, as a bad variant's does
            cause = ConfigError([f"{failed[0]}: {line}" for line in cause.lines])
        raise PartialResults(out, cause, failed[0], dest)
    return out


def _one_line(e: BaseException) -> str:
    from synodic.config.errors import ConfigError
    if isinstance(e, ConfigError):
        return "; ".join(e.lines)
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _write_csv(rows: list[dict], path: Path) -> None:
    import csv
    with open(path, "w", newline="") as f:
        # variants with different KV policies add different ledger columns: the union, first-seen order
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)


def _plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in dict.fromkeys(r["variant"] for r in rows):
        pts = [r for r in rows if r["variant"] == v and "memory_budget" not in r]
        ax.plot([r["batch"] for r in pts], [r["tokens_per_s"] for r in pts], marker="o", label=v)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tokens/s (median of repeats)")
    ax.set_title("pipeline=bench: decode throughput")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
