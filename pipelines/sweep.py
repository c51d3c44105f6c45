"""pipeline=sweep: a grid of runs on Ray Tune (retries, resume by config hash), one results.json per trial and
sweep.md / sweep.csv / sweep.png beside them.

    python run.py pipeline=sweep 'pipeline.grid={ssm: [eager, replay], quant: [none, mxfp4]}' \\
        'pipeline.base=[workload.max_tokens=16]'
"""
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from synodic.config.netcheck import RayAddress
from synodic.config.registry import Component, register


@register("pipeline")
class SweepPipeline(Component):
    kind: Literal["sweep"] = "sweep"
    grid: dict[str, list] | list[str] | list[list[str]] | None = Field(
        None, description="the trials: {key: [values]} (their product, e.g. {ssm: [eager, replay]}), "
        "or a list of trials, each an override string ('ssm=replay quant=mxfp4') or a list of overrides")
    base: list[str] = Field(default_factory=list, description="overrides every trial starts from")
    metric: str = Field("metrics.decode_tokens_per_s", description="the figure sweep.png plots per trial (a "
                        "column of sweep.csv: metrics.* or ledger.*)")
    cpus: float = Field(1.0, gt=0, description="CPUs per trial")
    gpus: float = Field(0.0, ge=0, description="GPUs per trial (fractions share a GPU)")
    max_failures: int = Field(1, ge=0, description="retries of a trial whose worker died or that raised")
    max_concurrent: int | None = Field(None, ge=1, description="trials at once; null: as Ray's resources allow")
    ray_address: RayAddress = Field(None, description="Ray cluster to join ('auto', 'host:port'); null: a local one")

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        # sweep.csv's figure columns are the flattened metrics.* and ledger.* of each trial's results.json
        if not v.strip().startswith(("metrics.", "ledger.")) or v.strip() in ("metrics.", "ledger."):
            raise ValueError("expected a column of sweep.csv, metrics.<name> or ledger.<name> (e.g. "
                             "metrics.decode_tokens_per_s)")
        return v.strip()


def run(cfg, run_dir: Path) -> dict:
    from synodic.distributed.sweep import check_trials, expand_grid, run_sweep, validate_trials
    from synodic.results.tables import write_table_files
    p = cfg.pipeline
    if not p.grid:
        from synodic.config.errors import ConfigError
        raise ConfigError([f"pipeline.grid={p.grid!r}: expected the trials, e.g. 'pipeline.grid={{ssm: [eager, "
                           f"replay]}}' or a list of override strings"])
    empty = [k for k, v in p.grid.items() if not v] if isinstance(p.grid, dict) else []
    if empty:  # an empty axis spans no trials
        from synodic.config.errors import ConfigError
        raise ConfigError([f"pipeline.grid.{k}=[]: an axis with no values makes no trials; expected at least one "
                           f"value" for k in empty])
    trials = validate_trials(expand_grid(p.grid, list(p.base)), "pipeline.grid")
    rows = run_sweep(trials, run_dir, p.cpus, p.gpus, p.max_failures, p.max_concurrent, p.ray_address)
    axes = list(p.grid) if isinstance(p.grid, dict) else ["overrides"]
    write_table_files(run_dir, "sweep", rows, first=["overrides", "config_hash", "status", "error"],
                      metric=p.metric, label="overrides", title=f"sweep: {p.metric} per trial ({', '.join(axes)})")
    done = sum(r["status"] == "done" for r in rows)
    print(f"sweep: {done} of {len(rows)} trials done; {run_dir / 'sweep.md'}")
    out = {"trials": rows, "metrics": {"trials": len(rows), "done": done, "failed": len(rows) - done}}
    check_trials(rows, out, "pipeline.grid")
    return out
