"""Per-layer weight-reconstruction error of a quant config, for eval reports and the quantize pipeline.

    layer_errors(model, quant)        -> {layer: relative MSE}, model left untouched
    scheme_errors(graph.quant)        -> the same numbers for a scheme already applied (no solving)
    error_rows(series)                -> rows for a markdown/CSV table (layer, one column per series)
    plot_layer_errors(series, path)   -> a PNG: one line per series, layers in model order, log scale

relative MSE = ||W - W_eff||^2 / ||W||^2, W_eff = dequant(Q(W / s)) * s: the weight the quantized layer
effectively applies (activation quantization not included). `series` maps a label (e.g. 'mxfp4 rtn')
to one such dict.
"""
from __future__ import annotations

from pathlib import Path


def _as_config(quant, **overrides):
    """A BlockQuant from a config object, a format name or a dict of fields (+ overrides)."""
    from synodic.quant.config import BlockQuant
    if isinstance(quant, str):
        quant = {"kind": quant}
    if isinstance(quant, dict):
        return BlockQuant(**{**quant, **overrides})
    return quant.model_copy(update=overrides) if overrides else quant


def layer_errors(model, quant, *, use_store: bool = True, **overrides) -> dict[str, float]:
    """Relative MSE per selected linear of an unquantized `model` for `quant` (BlockQuant, a format
    name, or a dict of its fields; keyword overrides such as method='rtn' apply on top). With
    use_store and quant.artifact != 'none', a stored artifact's manifest answers without solving."""

    import torch

    from synodic.quant import apply, store
    q = _as_config(quant, **overrides)
    names, _ = apply.select_linears(model, q.layers, q.kind)
    if use_store and q.artifact != "none":
        from synodic.config.errors import ConfigError
        try:
            adir = apply.resolve_artifact(q, apply.artifact_hash(apply.model_identity(model), q))
        except ConfigError:
            adir = None
        if adir is not None:
            man = store.read_manifest(adir)
            if all(n in man["layers"] for n in names):
                return {n: man["layers"][n]["rel_mse"] for n in names}
    mods = dict(model.named_modules())
    absmax = None
    if q.method == "smoothquant":
        ids = apply.calibration_ids(model.config.vocab_size, q.calib_samples, q.calib_len)
        absmax = apply.calibrate(model, names, ids)
    out = {}
    with torch.no_grad():
        for n in names:
            w = mods[n].weight
            a = None if absmax is None else absmax[n].to(w.device)
            _, st = apply.solve_linear(w, q.kind, q.method, q.method_opts(), a)
            out[n] = st["rel_mse"]
    return out


def scheme_errors(scheme) -> dict[str, float]:
    """Errors of an applied scheme (graph.quant from quant=<format>); {} for quant=none (None)."""
    return {} if scheme is None else dict(scheme.rel_mse)


def error_rows(series: dict[str, dict[str, float]]) -> list[dict]:
    layers = list(dict.fromkeys(n for errs in series.values() for n in errs))
    return [{"layer": n, **{label: errs.get(n) for label, errs in series.items()}} for n in layers]


def plot_layer_errors(series: dict[str, dict[str, float]], path: str | Path, title: str | None = None) -> Path:
    """One line per series over the layers (model order, short labels), log-scale relative MSE."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    layers = list(dict.fromkeys(n for errs in series.values() for n in errs))
    fig, ax = plt.subplots(figsize=(max(6.0, min(24.0, 0.12 * len(layers) + 4)), 4))
    for label, errs in series.items():
        xs = [i for i, n in enumerate(layers) if n in errs]
        ax.plot(xs, [errs[layers[i]] for i in xs], marker=".", lw=1, label=label)
    short = [n.replace("blocks.", "").replace(".mixer", "") for n in layers]
    step = max(1, len(layers) // 40)
    ax.set_xticks(range(0, len(layers), step))
    ax.set_xticklabels(short[::step], rotation=90, fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("relative MSE ||W - W_q||² / ||W||²")
    ax.set_title(title or "per-layer weight reconstruction error")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
