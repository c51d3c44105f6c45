"""pipeline=eval: held-out bits per byte (tokenizer-independent) and perplexity of the run's model;
with pipeline.reference, teacher-forced KL (mean, p95), p95 |Δ log-prob| and top-1 agreement against
the reference config over windows of >= 2048 tokens.

    python run.py pipeline=eval                                  # shipped tiny_mamba2 on the shard
    python run.py pipeline=eval quant=nvfp4 'pipeline.reference={quant: {kind: none}}'
    python run.py pipeline=eval ssm=replay ssm.precision=dual_fp8 pipeline.path=decode \
        'pipeline.reference={ssm: {kind: eager}}' pipeline.max_tokens=2048
"""
import logging
from contextlib import contextmanager
from pathlib import Path

from synodic.evaluation.config import EvalPipeline  # noqa: F401  (registers pipeline=eval)

log = logging.getLogger(__name__)


@contextmanager
def _counted(scorer, label: str, stream, seq_len: int, batch_size: int, min_len: int = 1, decode: bool = False):
    """`scorer` wrapped to advance a progress bar by one batch per call (the batches nll / compare make).
    The decode path shows its own per-step bar on a terminal; there only the log lines are added."""
    from synodic.evaluation.metrics import _batches
    from synodic.results.progress import on_terminal, progress
    n = sum(1 for b in _batches(stream, seq_len, batch_size, min_len) if min_len == 1 or b.shape[1] == seq_len + 1)
    with progress(label, n, "batches", enabled=not (decode and on_terminal())) as advance:
        def call(x):
            out = scorer(x)
            advance()
            return out
        yield call


def reference_config(cfg):
    """The run's config with pipeline.reference's groups replaced (a group whose kind changes is
    replaced whole; otherwise its fields are updated) and no reference of its own."""
    from synodic.config import ConfigError, validate
    raw = cfg.model_dump(mode="json")
    for group, ov in cfg.pipeline.reference.items():
        same = "kind" not in ov or ov["kind"] == raw[group]["kind"]
        raw[group] = {**raw[group], **ov} if same else dict(ov)
    raw["pipeline"] = {**raw["pipeline"], "reference": None}
    try:
        return validate(raw)
    except ConfigError as e:  # the keys are the reference's, given inside pipeline.reference
        raise ConfigError([f"pipeline.reference: {line}" for line in e.lines]) from None


def scale_decay(model, scale: float) -> None:
    """Every SSM layer's decay rate times `scale` (A_log += log scale; Mamba-2 and GDN both decay by
    exp(-exp(A_log) * dt-like gate)): scale < 1 lengthens the state memory."""
    import math

    import torch
    if scale == 1.0:
        return
    with torch.no_grad():  # in place: bumps the parameter version, so cached A = -exp(A_log) is rebuilt
        for m in model.ssm_layers:
            m.A_log.add_(math.log(scale))


def _scorer(cfg, seq_len: int):
    """(callable x → logits, graph): the model's forward, or the decode path (pipeline.path=decode)."""
    from synodic.graph import build_graph
    p = cfg.pipeline
    if p.path == "decode":
        from synodic.engine.teacher import DecodePathScorer
        g = build_graph(cfg, seq_len + 1, max_slots=p.batch_size)
        scale_decay(g.model, p.decay_scale)
        return DecodePathScorer(g, progress=True), g
    g = build_graph(cfg, seq_len + 1, max_slots=1)
    scale_decay(g.model, p.decay_scale)
    return g.model.eval(), g


def _forward_skips(cfg) -> list[str]:
    """The run's non-default SSM backend and KV policy that pipeline.path=forward does not run (the scores are
    the model's forward pass; only spec acceptance, when asked for, is served through them)."""
    if cfg.pipeline.path != "forward":
        return []
    return [f"{g}={getattr(cfg, g).kind}" for g, default in (("ssm", "eager"), ("kv", "resident"))
            if getattr(cfg, g).kind != default]


def _tokenizer(graph, vocab_size: int):
    from synodic.data.tokenizer import SHIPPED_TOKENIZER, load_tokenizer
    if graph.ckpt_dir is not None and (Path(graph.ckpt_dir) / "tokenizer.json").is_file():
        return load_tokenizer(graph.ckpt_dir)
    tok = load_tokenizer(SHIPPED_TOKENIZER)
    if tok.vocab_size != vocab_size:
        from synodic.config import ConfigError
        raise ConfigError([f"model vocab_size={vocab_size} without a tokenizer.json: expected a checkpoint "
                           f"with one, or vocab_size={tok.vocab_size} (the shipped tokenizer)"])
    return tok


SPEC_PROMPTS, SPEC_PROMPT_LEN, SPEC_NEW_TOKENS = 8, 64, 48
CPU_EVAL_TOKENS = 65536  # pipeline.max_tokens=null on the CPU: 8 batches of 4 x 2048, about a minute


def spec_acceptance(cfg, stream) -> dict:
    """Acceptance of the run's spec scheme on held-out prompts: SPEC_PROMPTS windows of SPEC_PROMPT_LEN tokens
    at evenly spaced offsets of the scored stream, each continued by SPEC_NEW_TOKENS tokens at the workload's
    temperature (0 = greedy), served by the Engine with the run's ssm / kv / quant."""
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.graph import build_graph
    n = len(stream) - SPEC_PROMPT_LEN
    step = max(1, n // SPEC_PROMPTS)
    prompts = [stream[i:i + SPEC_PROMPT_LEN].tolist() for i in range(0, max(n, 1), step)][:SPEC_PROMPTS]
    wl = cfg.workload
    reqs = [Request(i, p, SamplingParams(temperature=wl.temperature, top_p=wl.top_p, seed=wl.seed + i,
                                         max_tokens=SPEC_NEW_TOKENS)) for i, p in enumerate(prompts)]
    eng = Engine(build_graph(cfg, SPEC_PROMPT_LEN + SPEC_NEW_TOKENS + cfg.spec.window))
    eng.generate(reqs)
    return {**eng.spec_stats.summary(), "prompts": len(prompts), "prompt_tokens": SPEC_PROMPT_LEN,
            "new_tokens": SPEC_NEW_TOKENS, "temperature": wl.temperature}


def run(cfg, run_dir: Path) -> dict:
    import math

    from rich.console import Console
    from rich.table import Table

    from synodic.data.corpus import load_heldout
    from synodic.evaluation.metrics import compare, nll, token_stream

    p = cfg.pipeline
    rcfg = reference_config(cfg) if p.reference else None  # a bad reference is refused before any scoring
    model, graph = _scorer(cfg, p.seq_len)
    tok = _tokenizer(graph, graph.model.config.vocab_size)
    text = Path(p.text).read_text(encoding="utf-8") if p.text else load_heldout()
    stream = token_stream(tok, text)
    limit = p.max_tokens
    if limit is None and graph.device.type == "cpu" and len(stream) > CPU_EVAL_TOKENS + 1:
        # the whole shard is ~500k tokens: ~10 minutes of forward passes on 2 cores
        limit = CPU_EVAL_TOKENS
        from synodic.config.files import note
        note(f"pipeline.max_tokens=null on the CPU: scoring the first {limit:,} of {len(stream) - 1:,} tokens; "
             f"pipeline.max_tokens={len(stream)} scores all of them")
    if limit:
        stream = stream[:limit + 1]
    if rcfg is not None and len(stream) < p.seq_len + 1:  # compare() scores whole windows only
        from synodic.config import ConfigError
        key, val = (("pipeline.max_tokens", p.max_tokens) if p.max_tokens and p.max_tokens < p.seq_len else
                    ("pipeline.text", p.text) if p.text else ("pipeline.seq_len", p.seq_len))
        raise ConfigError([f"{key}={val!r} with pipeline.reference: {len(stream)} tokens of text hold no window of "
                           f"pipeline.seq_len={p.seq_len}; expected at least {p.seq_len + 1} tokens (a larger "
                           "pipeline.max_tokens, a longer pipeline.text or a smaller pipeline.seq_len)"])
    unused = _forward_skips(cfg)
    if unused:
        from synodic.config.files import note
        note(f"{', '.join(unused)} with pipeline.path=forward: the scores are the whole-window forward pass's, which "
             "runs no state backend or KV policy; pipeline.path=decode scores through them")
    tb = tok.token_bytes()
    n_bytes = sum(tb[i] for i in stream[1:].tolist())
    dec = p.path == "decode"
    with _counted(model, "eval", stream, p.seq_len, p.batch_size, decode=dec) as scorer:
        total, count = nll(scorer, stream, p.seq_len, p.batch_size, graph.device)
    m = {"bits_per_byte": total / math.log(2) / n_bytes, "perplexity": math.exp(total / count),
         "nll_per_token": total / count, "tokens": count, "bytes": n_bytes}
    rows = [("bits per byte", f"{m['bits_per_byte']:.4f}"), ("perplexity", f"{m['perplexity']:.3f}"),
            ("tokens / bytes", f"{count:,} / {n_bytes:,}")]
    out = {"metrics": m, "text": p.text or "shipped held-out shard", "max_tokens_used": limit,
           "weights": str(graph.ckpt_dir or "random"), "path": p.path, "not_exercised": unused}
    if rcfg is not None:
        ref, rgraph = _scorer(rcfg, p.seq_len)
        with _counted(ref, "eval reference", stream, p.seq_len, p.batch_size, decode=dec) as rscorer:
            rt, rc = nll(rscorer, stream, p.seq_len, p.batch_size, rgraph.device)
        with _counted(model, "eval compare", stream, p.seq_len, p.batch_size, p.seq_len, dec) as scorer:
            c = compare(scorer, ref, stream.to(graph.device), p.seq_len, p.batch_size, graph.device)
        m.update(bits_per_byte_reference=rt / math.log(2) / n_bytes, kl_mean=c["kl_mean"],
                 kl_p95=c["kl_p95"], kl_max=c["kl_max"], dlogprob_p95=c["dlogprob_p95"],
                 top1_agreement=c["top1_agreement"], compared_positions=c["positions"],
                 kl_mean_by_quarter=c["kl_mean_by_quarter"])
        out["reference"] = {g: rcfg.model_dump(mode="json")[g] for g in p.reference}
        rows += [("reference bits per byte", f"{m['bits_per_byte_reference']:.4f}"),
                 ("KL mean / p95 (nats)", f"{c['kl_mean']:.3e} / {c['kl_p95']:.3e}"),
                 ("p95 |Δ log-prob|", f"{c['dlogprob_p95']:.3e}"),
                 ("top-1 agreement", f"{c['top1_agreement']:.4f}"),
                 ("KL mean by window quarter", " / ".join(f"{k:.2e}" for k in c["kl_mean_by_quarter"])),
                 ("positions compared", f"{c['positions']:,} (windows of {p.seq_len})")]
    if p.quant_grid:
        from synodic.config import ConfigError
        from synodic.evaluation.quant_grid import run_grid
        if cfg.quant.kind != "none":
            raise ConfigError([f"pipeline.quant_grid with quant={cfg.quant.kind}: expected quant=none "
                               "(the grid is compared with the unquantized model)"])
        try:
            out["quant_grid"] = run_grid(cfg, p.quant_grid, p.quant_mode, stream, n_bytes, model, run_dir,
                                         _scorer, Console())
        except ValueError as e:  # a bad 'format:method' entry
            raise ConfigError([f"pipeline.quant_grid={p.quant_grid}: {e}".splitlines()[0]]) from None
    if cfg.spec.kind != "none":
        out["spec"] = spec_acceptance(cfg, stream)
        a = out["spec"]
        rows += [(f"spec={cfg.spec.kind} acceptance length", f"{a['mean_acceptance_length'] or 0:.3f}"),
                 ("acceptance by draft position", " ".join("-" if x is None else f"{x:.2f}"
                                                           for x in a["acceptance_rate_by_position"]))]
    table = Table(title=f"eval · {cfg.model.kind} · quant={cfg.quant.kind} · {graph.device}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)
    log.info("eval %s quant=%s on %s: %s", cfg.model.kind, cfg.quant.kind, graph.device,
             "; ".join(f"{k} {v}" for k, v in rows))
    return out
