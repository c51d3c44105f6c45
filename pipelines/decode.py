"""pipeline=decode (default): serve the workload, print a short table, return the results payload."""
from pathlib import Path
from typing import Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("pipeline")
class DecodePipeline(Component):
    kind: Literal["decode"] = "decode"
    show: int = Field(4, ge=0, description="requests whose text is printed in the summary table")
    stream: bool = Field(False, description="print request 0's tokens as they are generated")


def serve(cfg, requests=None, progress=True, on_token=None):
    """Serves the workload on the runtime's executor; returns (graph, engine, requests)."""
    from synodic.engine.text import load_codec
    from synodic.engine.workload import build_requests, max_seq_len
    from synodic.graph import checkpoint_dir
    from synodic.results.progress import progress as job_progress
    wl = cfg.workload
    vocab = cfg.model.architecture().vocab_size
    requests = requests or build_requests(wl, load_codec(checkpoint_dir(cfg.model)), vocab)
    executor = cfg.runtime.executor(cfg)
    seq_len = max_seq_len(wl, requests)
    total = sum(r.params.max_tokens for r in requests)
    if not progress:
        s = executor.serve(requests, seq_len, wl.concurrency, on_token=on_token)
        return s.graph, s.engine, s.requests
    made, shown = [0], [0]

    def show():
        advance(made[0] - shown[0])
        shown[0] = made[0]

    def tick(r, t):  # per token: a count only (a bar update costs ~3 µs, x batch per step)
        made[0] += 1
        if len(r.output_ids) == 1:  # a prefill's token: long prompts move the bar per prompt, not per step
            show()
        if on_token is not None:
            on_token(r, t)
    with job_progress("decode", total, "tokens") as advance:  # a bar on a terminal, run.log lines otherwise
        s = executor.serve(requests, seq_len, wl.concurrency, on_token=tick, progress=lambda _: show())
    return s.graph, s.engine, s.requests


def metrics(engine, requests) -> dict:
    done = [r for r in requests if r.first_token_s is not None]
    ttft = [1e3 * (r.first_token_s - r.arrival_s) for r in done]
    tpot = [1e3 * (r.finish_s - r.first_token_s) / (len(r.output_ids) - 1)
            for r in done if r.finish_s is not None and len(r.output_ids) > 1]
    wall = max((r.finish_s or r.arrival_s) for r in requests) - min(r.arrival_s for r in requests)
    dec_tokens = engine.ledger.tokens
    return {"decode_tokens_per_s": dec_tokens / engine.decode_s if engine.decode_s else 0.0,
            "ttft_ms": sum(ttft) / len(ttft) if ttft else None,
            "tpot_ms": sum(tpot) / len(tpot) if tpot else None,
            "wall_s": wall, "decode_s": engine.decode_s, "prefill_s": engine.prefill_s,
            "capture_s": engine.runner.capture_s, "prefill_forwards": engine.prefill_forwards,
            "output_tokens": sum(len(r.output_ids) for r in requests),
            "preemptions": sum(r.preemptions for r in requests),
            "finish_reasons": {k: sum(r.finish_reason == k for r in requests)
                               for k in sorted({str(r.finish_reason) for r in requests})}}


def spec_summary(engine) -> dict | None:
    """Acceptance counters and the drafter's description (None without speculative decoding)."""
    if engine.drafter is None:
        return None
    return {**engine.spec_stats.summary(), "drafter": engine.drafter.summary(),
            "num_speculative_tokens": engine.gamma}


def run(cfg, run_dir: Path) -> dict:
    from rich.console import Console
    from rich.table import Table

    from synodic.results.writer import request_record

    con = Console()
    p = cfg.pipeline
    from synodic.engine.text import load_codec
    from synodic.graph import checkpoint_dir

    stream = None
    if p.stream:  # request 0's text as it is generated, through the engine's per-token hook
        codec0 = load_codec(checkpoint_dir(cfg.model))

        def stream(r, tok):
            if r.id == 0:
                con.print(codec0.decode([tok]), end="", markup=False, highlight=False)
    graph, engine, requests = serve(cfg, on_token=stream, progress=not p.stream)
    if p.stream:
        con.print()
    codec = graph.codec
    m = metrics(engine, requests)
    table = Table(title=f"{cfg.model.kind} · ssm={cfg.ssm.kind} · kv={cfg.kv.kind} · {graph.device}")
    table.add_column("id", justify="right")
    table.add_column("prompt")
    table.add_column("output")
    for r in requests[: p.show]:
        table.add_row(str(r.id), codec.decode(r.prompt_ids)[-40:], codec.decode(r.output_ids)[:120])
    con.print(table)
    led = engine.ledger.summary()
    con.print(f"{m['output_tokens']} tokens from {len(requests)} requests in {m['wall_s']:.2f}s · "
              f"decode {m['decode_tokens_per_s']:.1f} tok/s · TTFT {m['ttft_ms'] or 0:.1f} ms · "
              f"TPOT {m['tpot_ms'] or 0:.2f} ms · preemptions {m['preemptions']} · "
              f"SSM bytes/token {led['ssm_bytes_per_token']:.0f}")
    # requests cut short by the KV pool are in results.json's finish reasons; say so where the person looks too
    short = {k: n for k, n in m["finish_reasons"].items() if "kv_capacity" in k and n}
    if short:
        con.print(f"[yellow]{sum(short.values())} of {len(requests)} requests ended early for lack of KV pages "
                  f"({', '.join(f'{k}: {n}' for k, n in short.items())}); expected kv.num_blocks="
                  f"{getattr(cfg.kv, 'num_blocks', '?')} to hold this workload: raise it[/yellow]")
    spec = spec_summary(engine)
    if spec is not None:
        acc = spec["mean_acceptance_length"]
        con.print(f"spec={cfg.spec.kind} · acceptance length {'-' if acc is None else f'{acc:.2f}'} · drafted "
                  f"{spec['drafted_tokens']} · accepted {spec['accepted_tokens']} · plain steps "
                  f"{spec['plain_steps']} of {spec['steps']} · by position "
                  + " ".join("-" if a is None else f"{a:.2f}" for a in spec["acceptance_rate_by_position"]))
    out = {"requests": [request_record(r, codec) for r in requests], "metrics": m, "ledger": led, "spec": spec,
            "tokenizer": codec.name, "weights": str(graph.ckpt_dir or "random"),
            "quant": graph.quant.summary() if graph.quant is not None else None,
            "graph": {"device": str(graph.device), "cuda_graphs": graph.cuda_graphs, "notes": graph.notes}}
    if engine.replicas is not None:  # runtime=ray: each replica's device, requests, rate and ledger
        out["replicas"] = engine.replicas
    if m["output_tokens"] == 0 and short.get("rejected_kv_capacity", 0) == len(requests) > 0:
        # no request fit the pool at all: a run that produced nothing is not a success (results.json says why)
        from synodic.config.errors import ConfigError, PartialResults
        nb = getattr(cfg.kv, "num_blocks", "?")
        why = (f"kv.num_blocks={nb}: the KV pool holds none of the {len(requests)} requests (every one "
               f"rejected_kv_capacity); expected a pool of at least one request's prompt + max_tokens")
        out["incomplete"] = {"at": "kv.num_blocks", "error": why}
        raise PartialResults(out, ConfigError([why]), "kv.num_blocks")
    return out
