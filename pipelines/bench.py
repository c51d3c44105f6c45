"""pipeline=bench: decode throughput over batch sizes for one or more variants, side by side in one
process (same inputs), as a markdown + CSV table and a plot in the run dir."""
import time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("pipeline")
class BenchPipeline(Component):
    kind: Literal["bench"] = "bench"
    batch_sizes: list[Annotated[int, Field(ge=1)]] = Field([1, 4, 16], min_length=1,
                                                         description="decode batch sizes to time")
    variants: list[str] = Field([""], min_length=1, description="override strings, one per variant, "
                                "applied on top of the run's overrides ('' = the run's own config)")
    prompt_len: int = Field(32, ge=1, description="prompt tokens per sequence before timing")
    steps: int = Field(16, ge=1, description="timed decode steps per point")
    warmup: int = Field(2, ge=0, description="untimed decode steps first (graph capture, autotune)")
    stagger: int = Field(16, ge=0, description="rows join over this many untimed steps first (row s after s mod "
                         "stagger steps), so positions and replay cursors are spread as when requests arrive over "
                         "time; 0 or 1: every row starts together (replay then flushes every row on the same step)")
    profile: bool = Field(False, description="after all timings, per variant at the largest batch: 3 "
                          "uncaptured steps under torch.profiler, per-kernel time table in profile_<variant #>.txt "
                          "(where the step's time goes)")


def _task_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        return [o for o in HydraConfig.get().overrides.task if not o.startswith("pipeline")]
    except ValueError:  # not under a Hydra job
        return []


def time_point(graph, b: int, p: BenchPipeline, profile_path: Path | None = None) -> dict:
    """Prefill b random prompts, let the rows join over p.stagger steps, then time p.steps batched decode steps
    (greedy feedback) the way the engine runs them: overlapped when graph.overlap (step N + 1 queued with
    step N's tokens still on the device, N's tokens read back while N + 1 runs), else one host sync per step;
    the byte ledger is taken every step in both."""
    import torch

    from synodic.engine.runner import ModelRunner
    from synodic.engine.scheduler import Scheduler
    from synodic.transfer import PendingTokens

    runner = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device, graph.cuda_graphs)
    gen = torch.Generator().manual_seed(b)
    vocab = graph.model.config.vocab_size
    total = p.prompt_len + p.stagger + p.warmup + p.steps + 2
    if graph.kv is not None:  # every row holds its pages for the whole run: check before any prefill
        blocks = graph.kv.blocks
        need = b * blocks.blocks_for(total)
        if need > blocks.num_blocks:
            from synodic.config.errors import ConfigError
            raise ConfigError([f"kv.num_blocks={blocks.num_blocks}: batch {b} x {total} tokens (prompt_len + "
                               f"stagger + warmup + steps + 2) needs {need} pages of {blocks.block_size}; expected "
                               f"kv.num_blocks >= {need} or fewer pipeline.steps"])
    prompts = [torch.randint(0, vocab, (p.prompt_len,), generator=gen).tolist() for _ in range(b)]
    Scheduler(graph.max_slots, graph.kv.blocks if graph.kv is not None else None, graph.max_slots).hold(
        list(range(b)), total)
    per = max(1, graph.cfg.runtime.prefill_tokens // p.prompt_len) if runner.batched_prefill else 1
    toks = []
    for s in range(0, b, per):  # batched prefill, as the engine's
        toks += runner.prefill_batch(list(range(s, min(b, s + per))), prompts[s:s + per]).argmax(-1).tolist()
    pos = [p.prompt_len] * b
    if p.stagger > 1:  # uncaptured steps: no graphs for the partial batches
        joiner = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device, False)
        for k in range(p.stagger):
            rows = [s for s in range(b) if s % p.stagger <= k]
            out = joiner.decode(rows, [pos[s] for s in rows], [toks[s] for s in rows], max(pos) + 1).argmax(-1)
            graph.advance(rows)  # cursor mirrors stay in step
            for s, t in zip(rows, out.tolist()):
                toks[s], pos[s] = t, pos[s] + 1
    slots = list(range(b))

    def sync():
        if graph.device.type == "cuda":
            torch.cuda.synchronize()

    # every step's KV view bucket covers the run's last position, so the graph captured in warm-up serves every
    # timed step (a view crossing a power-of-two page count mid-run would time a capture)
    view_len = max(pos) + p.warmup + p.steps + 2

    def launch(tokens, ahead: int):
        logits = runner.decode(slots, [q + ahead for q in pos], tokens, view_len)
        nxt = logits.argmax(-1)
        return nxt, PendingTokens(nxt)

    def finish(pending) -> dict:
        toks[:] = pending.wait()
        step_b = graph.step_bytes(slots, [q + 1 for q in pos])
        graph.advance(slots)
        pos[:] = [q + 1 for q in pos]
        return step_b

    def run_steps(n: int) -> dict[str, float]:
        """n steps; returns their summed ledger entries."""
        acc: dict[str, float] = {}
        if n == 0:
            return acc
        step = launch(toks, 0)
        for i in range(n):
            nxt = launch(step[0], 1) if graph.overlap and i + 1 < n else None
            for k, v in finish(step[1]).items():
                acc[k] = acc.get(k, 0) + v
            step = nxt if nxt is not None or i + 1 == n else launch(toks, 0)
        return acc

    run_steps(p.warmup)
    sync()
    t0 = time.perf_counter()
    acc = {k: v / p.steps for k, v in run_steps(p.steps).items()}
    step_s = (time.perf_counter() - t0) / p.steps
    if profile_path is not None:
        _profile(graph, slots, pos[0], toks, b, profile_path)
    bytes_ = acc
    moved = sum(v for k, v in bytes_.items() if not k.startswith("kv_") or k in ("kv_device_read",))
    moved -= bytes_.get("kv_selected_rows", 0) + bytes_.get("kv_host_fetched_rows", 0)
    return {"batch": b, "step_ms": 1e3 * step_s, "tokens_per_s": b / step_s, "bytes_per_step": moved,
            "GB_per_s": moved / step_s / 1e9, **{f"bytes_{k}": v for k, v in bytes_.items()}}


def _profile(graph, slots, pos, toks, b, path: Path) -> None:
    """3 uncaptured decode steps (kernels visible one by one) under torch.profiler -> table at path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from synodic.engine.runner import ModelRunner

    eager = ModelRunner(graph.model, graph.ssm, graph.kv, graph.max_slots, graph.device, False)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if graph.device.type == "cuda" else [])
    logits = eager.decode(slots, [pos] * b, toks, pos + 1)  # warm the uncaptured path
    pos += 1
    with profile(activities=acts) as prof:
        for _ in range(3):
            logits = eager.decode(slots, [pos] * b, logits.argmax(-1).tolist(), pos + 1)
            graph.advance(slots)
            pos += 1
        if graph.device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if graph.device.type == "cuda" else "self_cpu_time_total"
    path.write_text(f"batch {b}, 3 uncaptured decode steps\n"
                                     + prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=80))


def run(cfg, run_dir: Path) -> dict:
    import csv

    from rich.console import Console

    from synodic.config.compose import compose
    from synodic.graph import build_graph
    from synodic.results.writer import markdown_table

    p = cfg.pipeline
    con = Console()
    base = _task_overrides()
    rows = []
    max_len = p.prompt_len + p.stagger + p.warmup + p.steps + 3
    for v in p.variants:
        vcfg = compose(base + v.split()) if v else cfg
        graph = build_graph(vcfg, max_len, max_slots=max(p.batch_sizes))
        # what the weights occupy (parameters + buffers: a quantized model's packed codes, and its dense copies
        # when quant.dense_copy keeps them)
        tensors = {id(t): t for t in [*graph.model.parameters(), *graph.model.buffers()]}.values()
        model_gib = sum(t.numel() * t.element_size() for t in tensors) / 2**30
        for b in p.batch_sizes:
            r = {"variant": v or "base", **time_point(graph, b, p), "model_GiB": round(model_gib, 3)}
            con.print(f"{r['variant']:>30} batch {b:>4}: {r['step_ms']:.3f} ms/step, "
                      f"{r['tokens_per_s']:.0f} tok/s, {r['GB_per_s']:.1f} GB/s")
            rows.append(r)
        del graph
    if p.profile:  # a separate pass: a profiler session can slow the CUDA-graph timings that follow it
        quick = p.model_copy(update={"steps": 1, "warmup": 1})
        for i, v in enumerate(p.variants):
            graph = build_graph(compose(base + v.split()) if v else cfg, max_len, max_slots=max(p.batch_sizes))
            time_point(graph, max(p.batch_sizes), quick, run_dir / f"profile_{i}.txt")
            del graph
    cols = ["variant", "batch", "step_ms", "tokens_per_s", "bytes_per_step", "GB_per_s", "model_GiB"]
    md = markdown_table(rows, cols)
    (run_dir / "bench.md").write_text(md + "\n")
    with open(run_dir / "bench.csv", "w", newline="") as f:
        # variants with different KV policies add different ledger columns: the union, first-seen order
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)
    _plot(rows, run_dir / "bench.png")
    con.print(md)
    return {"bench": rows, "metrics": {"decode_tokens_per_s": max(r["tokens_per_s"] for r in rows)}}


def _plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in dict.fromkeys(r["variant"] for r in rows):
        pts = [r for r in rows if r["variant"] == v]
        ax.plot([r["batch"] for r in pts], [r["tokens_per_s"] for r in pts], marker="o", label=v)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tokens/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
