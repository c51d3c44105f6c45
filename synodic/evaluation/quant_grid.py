"""Accuracy of quantization schemes, format × method, against the unquantized model: teacher-forced KL
(mean, p95), top-1 agreement, held-out perplexity / bits per byte and per-layer weight error; written
as a table (markdown + CSV) and plots in the run dir."""
import csv
import math
from pathlib import Path

from synodic.config import validate
from synodic.results.writer import markdown_table

from .metrics import compare, nll


def grid_configs(cfg, items: list[str], mode: str | None):
    """'fmt:method' strings → validated RunConfigs (the run's config with quant replaced)."""
    out = []
    for item in items:
        fmt, _, method = item.partition(":")
        raw = cfg.model_dump(mode="json")
        raw["quant"] = {"kind": fmt, "method": method or "dualquant", "artifact": "none"}
        if mode is not None:
            raw["quant"]["mode"] = mode
        raw["pipeline"] = {**raw["pipeline"], "quant_grid": [], "reference": None}
        out.append((item, validate(raw)))
    return out


def run_grid(cfg, items, mode, stream, n_bytes, ref_model, run_dir: Path, make_scorer, console) -> list[dict]:
    from synodic.quant.report import error_rows, plot_layer_errors, scheme_errors

    p = cfg.pipeline
    rows, layer_series = [], {}
    for label, qcfg in grid_configs(cfg, items, mode):
        console.print(f"quant grid: {label} ({qcfg.quant.mode or 'weight-only'})")
        scorer, graph = make_scorer(qcfg, p.seq_len)
        total, count = nll(scorer, stream, p.seq_len, p.batch_size, graph.device)
        c = compare(scorer, ref_model, stream.to(graph.device), p.seq_len, p.batch_size, graph.device)
        errs = scheme_errors(graph.quant)
        layer_series[label] = errs
        rows.append({"scheme": label, "mode": qcfg.quant.mode or "weight-only",
                     "bits_per_byte": total / math.log(2) / n_bytes,
                     "perplexity": math.exp(total / count), "kl_mean": c["kl_mean"], "kl_p95": c["kl_p95"],
                     "dlogprob_p95": c["dlogprob_p95"], "top1_agreement": c["top1_agreement"],
                     "weight_rel_mse_mean": sum(errs.values()) / max(len(errs), 1)})
    cols = list(rows[0])
    (run_dir / "quant_grid.md").write_text(markdown_table(rows, cols) + "\n")
    with open(run_dir / "quant_grid.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    with open(run_dir / "quant_layer_error.csv", "w", newline="") as f:
        lr = error_rows(layer_series)
        w = csv.DictWriter(f, fieldnames=list(lr[0]))
        w.writeheader()
        w.writerows(lr)
    plot_layer_errors(layer_series, run_dir / "quant_layer_error.png", title="per-layer weight error")
    _plot_kl(rows, run_dir / "quant_grid.png", f"KL to unquantized {cfg.model.kind}, {len(stream) - 1:,} "
                                                "tokens held out (lower is better)")
    console.print(markdown_table(rows, cols))
    return rows


def _plot_kl(rows, path: Path, title: str = "") -> None:
    """Bars on a linear axis from zero, each labelled with its value: a log axis would make a 2.5 %
    difference between two schemes look like a tenfold one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    labels = [f"{r['scheme']}\n{r['mode']}" for r in rows]
    kl = [r["kl_mean"] for r in rows]
    bars = ax.bar(labels, kl)
    ax.bar_label(bars, labels=[f"{v:.3g}" for v in kl], fontsize=8)
    ax.set_ylim(0, max(kl) * 1.15 if max(kl) > 0 else 1)
    ax.set_ylabel("mean teacher-forced KL to unquantized (nats/token)")
    ax.set_xlabel("format:method, mode")
    ax.set_title(title or "quantization error: KL of each scheme against the unquantized model")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
