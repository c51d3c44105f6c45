"""Writes results.json with the contract fields and a markdown summary beside it."""
import json
from pathlib import Path

from synodic.config.schema import config_hash

from .env import environment


def request_record(r, codec) -> dict:
    return {"id": r.id, "prompt_ids": r.prompt_ids, "output_ids": r.output_ids,
            "text": codec.decode(r.output_ids), "finish_reason": r.finish_reason,
            "preemptions": r.preemptions}


def write_results(run_dir: Path, cfg, choices: dict, payload: dict, device=None) -> Path:
    doc = {"config": cfg.model_dump(mode="json"), "config_hash": config_hash(cfg), "choices": choices,
           "env": environment(device)}
    doc.update(payload)
    path = Path(run_dir) / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def markdown_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
