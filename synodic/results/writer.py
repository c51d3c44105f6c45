"""Writes results.json with the contract fields and a markdown summary beside it."""
import json
import os
import tempfile
from pathlib import Path

from synodic.config.schema import config_hash

from .env import environment
from .strict import finite_only


def request_record(r, codec) -> dict:
    return {"id": r.id, "prompt_ids": r.prompt_ids, "output_ids": r.output_ids,
            "text": codec.decode(r.output_ids), "finish_reason": r.finish_reason,
            "preemptions": r.preemptions}


def write_results(run_dir: Path, cfg, choices: dict, payload: dict, device=None) -> Path:
    doc = {"config": cfg.model_dump(mode="json"), "config_hash": config_hash(cfg), "choices": choices,
           "env": environment(device)}
    doc.update(payload)
    doc = json.loads(json.dumps(doc, default=str))  # plain types first (tensors, paths → str)
    doc, bad = finite_only(doc)
    if bad:
        doc["non_finite"] = bad
    path = Path(run_dir) / "results.json"
    fd, tmp = tempfile.mkstemp(prefix=".results.", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=2, allow_nan=False))
    os.replace(tmp, path)  # atomic: a reader never sees half a file; unique name: concurrent writers
    return path


def partial_dir(run_dir: Path) -> Path:
    """Where a run that stopped part-way writes what finished: the run directory, unless it holds an earlier run's
    complete results.json, which a failed rerun must not replace; then its `incomplete/` subdirectory."""
    run_dir = Path(run_dir)
    try:
        earlier = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return run_dir  # none (or unreadable): nothing complete to keep
    if not isinstance(earlier, dict) or "incomplete" in earlier:
        return run_dir
    (run_dir / "incomplete").mkdir(exist_ok=True)
    return run_dir / "incomplete"


def markdown_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
