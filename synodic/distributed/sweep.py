"""Sweeps on Ray Tune: one trial per set of overrides, each a whole run (its pipeline, its results.json) in a
Ray worker, retried when its worker dies or it raises (`FailureConfig`), resumed with `Tuner.restore`.

Why Ray Tune and not `hydra/launcher=ray`: that launcher runs `-m` jobs as Ray tasks but Hydra's job runner
catches each job's exception, so Ray never retries one, and it cannot resume a sweep; Tune's trial runner
retries failed trials, restores an experiment from its directory, and reports done / running / failed.

Trials are keyed by the hash of their validated config: a trial whose `trials/<hash>/results.json` exists is
finished and is read back, not run, so rerunning a sweep in the same directory runs only what is unfinished
or failed.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from synodic.config.errors import ConfigError


def expand_grid(grid, base: list[str]) -> list[list[str]]:
    """Override lists of the trials: a dict {key: [values]} spans the product of its axes in order, a list holds
    one override string (space-separated overrides) or one list per trial; `base` goes first in every trial."""
    if isinstance(grid, dict):
        keys = list(grid)
        return [[*base, *(f"{k}={v}" for k, v in zip(keys, combo))]
                for combo in itertools.product(*(grid[k] for k in keys))]
    out = []
    for t in grid:
        out.append([*base, *(t.split() if isinstance(t, str) else list(t))])
    return out


@dataclass
class Trial:
    overrides: list[str]
    config_hash: str
    cfg: object


def validate_trials(trial_overrides: list[list[str]], key: str, noun: str = "trial",
                    distinct: bool = True) -> list[Trial]:
    """Every trial composed and validated before any runs; one line per bad trial, naming its overrides.
    `distinct`: two trials of one config are refused (a sweep's grid); an ablation's rows may repeat a config
    (cumulative's last row is leave-one-out's full one) and are run once per config by the caller."""
    from synodic.config.compose import compose
    from synodic.config.hydra_errors import format_hydra_error
    from synodic.config.schema import config_hash
    trials, problems = [], []
    for i, over in enumerate(trial_overrides):
        try:
            cfg = compose(over)
        except ConfigError as e:
            problems += [f"{key}: {noun} {i} ({' '.join(over)}): {line}" for line in e.lines]
            continue
        except Exception as e:  # noqa: BLE001 - Hydra's own errors (unknown option, grammar) for this trial
            problems += [f"{key}: {noun} {i} ({' '.join(over)}): {line}" for line in format_hydra_error(e, over)]
            continue
        if cfg.pipeline.kind in ("sweep", "ablate"):
            problems.append(f"{key}: {noun} {i} ({' '.join(over)}): pipeline={cfg.pipeline.kind} inside a sweep; "
                            f"expected a pipeline a trial runs (decode, bench, eval, ...)")
            continue
        addr = getattr(cfg.runtime, "address", None) or getattr(cfg.pipeline, "ray_address", None)
        if addr:  # a trial joins the sweep's Ray instance: an address of its own would be ignored
            problems.append(f"{key}: {noun} {i} ({' '.join(over)}): a Ray address ({addr!r}) inside a sweep; "
                            "expected pipeline.ray_address of the sweep (its trials run on the sweep's cluster)")
            continue
        trials.append(Trial(over, config_hash(cfg), cfg))
    if problems:
        raise ConfigError(problems)
    seen = {}
    for t in trials if distinct else ():
        if t.config_hash in seen:
            raise ConfigError([f"{key}: trials ({' '.join(seen[t.config_hash])}) and ({' '.join(t.overrides)}) "
                               f"are the same config (hash {t.config_hash}); expected distinct trials"])
        seen[t.config_hash] = t.overrides
    return trials


def run_trial(overrides: list[str], trial_dir: str) -> dict:
    """One trial in this process: its pipeline run and results.json written; returns the results document."""
    import importlib

    from synodic.config.compose import compose
    from synodic.graph import resolve_device
    from synodic.results.writer import write_results
    cfg = compose(overrides)
    d = Path(trial_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "overrides.json").write_text(json.dumps(overrides))
    (d / "worker.pid").write_text(str(os.getpid()))  # which process runs it (observability, fault tests)
    payload = importlib.import_module(f"synodic.pipelines.{cfg.pipeline.kind}").run(cfg, d)
    choices = {g: getattr(cfg, g).kind for g in ("model", "ssm", "kv", "spec", "quant", "workload", "runtime",
                                                  "pipeline")}
    path = write_results(d, cfg, choices, payload, resolve_device(cfg.runtime))
    return json.loads(path.read_text())


def _trainable(config):
    from ray import tune
    config = config["trial"]
    done = Path(config["trial_dir"]) / "results.json"
    doc = json.loads(done.read_text()) if done.exists() else run_trial(config["overrides"], config["trial_dir"])
    tune.report(flat_metrics(doc))


def flat_metrics(doc: dict) -> dict:
    """A results document's scalar metrics and ledger figures, flattened as `metrics.x` / `ledger.x.y`."""
    out = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else k, x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix] = v
    walk("metrics", doc.get("metrics", {}))
    walk("ledger", doc.get("ledger", {}))
    return out


class TrialsFailed(RuntimeError):
    """Some trials of a sweep or study failed; the rest of its table was written."""


def check_trials(rows: list[dict], payload: dict, key: str) -> None:
    """Raise PartialResults (the table kept, one line, a non-zero exit) when any trial failed: a script must not
    read a sweep whose trials failed as a finished one."""
    failed = [r for r in rows if r.get("status") != "done"]
    if not failed:
        return
    from synodic.config.errors import PartialResults
    first = failed[0]
    err = f": {first['error']}" if first.get("error") else ""
    why = f"{len(failed)} of {len(rows)} trials failed (first: {first.get('overrides', '')}{err})"
    payload["incomplete"] = {"at": key, "error": why}
    raise PartialResults(payload, TrialsFailed(why), key)


def _check_fits(have: dict, cpus: float, gpus: float) -> None:
    from synodic.config.errors import ConfigError
    for key, want, kind in (("pipeline.gpus", gpus, "GPU"), ("pipeline.cpus", cpus, "CPU")):
        n = have.get(kind, 0)
        if want > n:
            raise ConfigError([f"{key}={want:g}: the Ray cluster has {n:g} {kind}s, so no trial could start; "
                               f"expected {key} <= {n:g} (or pipeline.ray_address= a cluster with more)"])


def run_sweep(trials: list[Trial], sweep_dir: Path, cpus: float, gpus: float, max_failures: int,
              max_concurrent: int | None, ray_address: str | None) -> list[dict]:
    """Every trial run (or read back) on Ray Tune; one row per trial: overrides, hash, status, error, metrics."""
    from ray import tune

    from synodic.distributed.cluster import ray_session
    sweep_dir = Path(sweep_dir).resolve()
    tdir = sweep_dir / "trials"
    grid = [{"overrides": t.overrides, "trial_dir": str(tdir / t.config_hash)} for t in trials]
    slots = max(1, int(max_concurrent or 2) * max(1, int(cpus)))
    with ray_session(ray_address, "pipeline.ray_address", num_cpus=slots) as ray:
        _check_fits(ray.cluster_resources(), cpus, gpus)  # (a trial asking for more than the cluster has waits forever)
        name, storage = "tune", str(sweep_dir)
        trainable = tune.with_resources(_trainable, {"cpu": cpus, "gpu": gpus})
        exp = sweep_dir / name
        same = (sweep_dir / "grid.json").exists() and json.loads((sweep_dir / "grid.json").read_text()) == grid
        if same and tune.Tuner.can_restore(str(exp)):
            tuner = tune.Tuner.restore(str(exp), trainable, restart_errored=True)
        else:
            (sweep_dir / "grid.json").write_text(json.dumps(grid, indent=1))
            tuner = tune.Tuner(
                trainable, param_space={"trial": tune.grid_search(grid)},
                tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
                run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1,
                                          failure_config=tune.FailureConfig(max_failures=max_failures)))
        # a failing trial's traceback stays in its error.txt (Tune) and its row names the error: not on the terminal
        quiet = logging.getLogger("ray.tune.execution.tune_controller")
        level, quiet.level = quiet.level, logging.CRITICAL
        try:
            results = tuner.fit()
        finally:
            quiet.setLevel(level)
    rows = []
    by_dir = {}
    for r in results:
        trial = r.config.get("trial", r.config)
        by_dir[trial["trial_dir"]] = r
    for t in trials:
        d = tdir / t.config_hash
        r = by_dir.get(str(d))
        row = {"overrides": " ".join(t.overrides), "config_hash": t.config_hash}
        doc_path = d / "results.json"
        if doc_path.exists():
            row.update(status="done", error="", **flat_metrics(json.loads(doc_path.read_text())))
        else:
            err = str(r.error).strip().splitlines()[-1] if r is not None and r.error is not None else "not run"
            row.update(status="failed", error=err)
        rows.append(row)
    return rows
