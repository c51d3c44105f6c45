"""pipeline=ablate: what each change to the config bought. A study (conf/ablation/<study>.yaml) is a base and
ordered arms, each a set of overrides; `cumulative` adds the arms one after another, `leave_one_out` takes
one arm at a time out of the full config. Every row is a run through the sweep runner (so rows retry and
resume), its Δconfig computed from the validated config dumps.

    python run.py pipeline=ablate pipeline.study=headline
"""
from pathlib import Path
from typing import Literal

from pydantic import Field

from synodic.config.netcheck import RayAddress
from synodic.config.registry import Component, register

ENV_KEYS = ("device", "device_name", "torch", "triton", "git_commit")


@register("pipeline")
class AblatePipeline(Component):
    kind: Literal["ablate"] = "ablate"
    study: str = Field("headline", description="a study in conf/ablation/ (its file name without .yaml) or a path "
                       "to a study YAML: `base` (overrides), `arms` (list of {name, overrides}), optional `quality`")
    mode: Literal["cumulative", "leave_one_out", "both"] = Field("both", description="cumulative: base, then each "
                                                                 "arm added to the previous row; leave_one_out: "
                                                                 "the full config, then it minus one arm at a time")
    base: list[str] = Field(default_factory=list, description="overrides added to the study's base (e.g. a model)")
    quality: bool | None = Field(None, description="also score each row on the held-out text with pipeline=eval "
                                 "(bits per byte); null: as the study says")
    allow_mixed_env: bool = Field(False, description="keep speed figures of rows run on another device, torch, "
                                  "triton or commit than the base row, flagged in the env column; false: blanked")
    cpus: float = Field(1.0, gt=0, description="CPUs per row's run")
    gpus: float = Field(0.0, ge=0, description="GPUs per row's run")
    max_failures: int = Field(1, ge=0, description="retries of a row whose run failed")
    max_concurrent: int | None = Field(None, ge=1, description="runs at once; null: as Ray's resources allow")
    ray_address: RayAddress = Field(None, description="Ray cluster to join; null: a local one")


def load_study(study: str) -> dict:
    """The study's dict, checked: a missing study lists the shipped ones; a file that is not UTF-8 YAML, or a
    field of the wrong type, is one line naming the study file and the field."""
    import yaml

    from synodic.config.compose import CONF_DIR
    from synodic.config.errors import ConfigError
    shipped = CONF_DIR / "ablation"
    path = Path(study) if study.endswith((".yaml", ".yml")) else shipped / f"{study}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
        raise ConfigError([f"pipeline.study={study!r}: no such study; expected one of {names} or a YAML path"])
    where = f"pipeline.study={study!r}"
    data = path.read_bytes()
    try:
        d = yaml.safe_load(data.decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError([f"{where}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); expected a UTF-8 "
                           "YAML study file"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        why = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError([f"{where}: not valid YAML ({why}{at}); expected a mapping with `base` and `arms`"]) from None
    if not isinstance(d, dict):
        raise ConfigError([f"{where}: the file holds a {type(d).__name__}; expected a mapping with `base` (a list of "
                           "overrides) and `arms` (a list of {name, overrides})"])
    bad = _overrides_problems(f"{where}: base", d.get("base", []))
    arms = d.get("arms")
    if not isinstance(arms, list) or not arms:
        bad.append(f"{where}: arms={arms!r}: expected a non-empty list of {{name, overrides}}")
    else:
        for i, a in enumerate(arms):
            if not (isinstance(a, dict) and a.get("name") and a.get("overrides")):
                bad.append(f"{where}: arms[{i}]={a!r}: lacks a name or overrides; expected {{name, overrides}}")
            else:
                bad += _overrides_problems(f"{where}: arms[{i}].overrides", a["overrides"])
    if not isinstance(d.get("quality", False), bool):
        bad.append(f"{where}: quality={d['quality']!r}: expected true or false")
    if bad:
        raise ConfigError(bad)
    return d


def _overrides_problems(where: str, v) -> list[str]:
    """A list of override strings: a bare string would be split into characters, a number is no override."""
    if isinstance(v, str):
        return [f"{where}={v!r}: a string; expected a list of overrides ([{v}])"]
    if not isinstance(v, list):
        return [f"{where}={v!r}: expected a list of overrides (key=value or group=option strings)"]
    return [f"{where}[{j}]={o!r}: expected an override string (key=value or group=option)"
            for j, o in enumerate(v) if not isinstance(o, str) or not o.strip()]


def rows_of(study: dict, extra_base: list[str], mode: str) -> list[dict]:
    """The study's rows: name, overrides, and the row its Δconfig and 'vs previous' ratio are taken against."""
    base = [*study.get("base", []), *extra_base]
    arms = study["arms"]
    rows = []
    if mode in ("cumulative", "both"):
        rows.append({"mode": "cumulative", "name": "base", "overrides": base, "ref": None})
        acc = list(base)
        for a in arms:
            acc = [*acc, *a["overrides"]]
            rows.append({"mode": "cumulative", "name": f"+ {a['name']}", "overrides": acc, "ref": len(rows) - 1})
    if mode in ("leave_one_out", "both"):
        full = [*base, *(o for a in arms for o in a["overrides"])]
        i_full = len(rows)
        rows.append({"mode": "leave_one_out", "name": "full", "overrides": full, "ref": None})
        for j, a in enumerate(arms):
            without = [*base, *(o for k, b in enumerate(arms) if k != j for o in b["overrides"])]
            rows.append({"mode": "leave_one_out", "name": f"- {a['name']}", "overrides": without, "ref": i_full})
    return rows


def table(rows: list[dict], docs: list[dict | None], quality: list[dict | None], allow_mixed_env: bool) -> list[dict]:
    """One table row per study row: Δconfig against its reference row, speed, bytes per step per store,
    quality, and the ratios to the base (the first row of its mode) and to the reference row."""
    from synodic.results.diff import config_diff, format_diff
    out = []
    first_of_mode = {}
    for i, (r, doc, q) in enumerate(zip(rows, docs, quality)):
        first_of_mode.setdefault(r["mode"], i)
        base_i = first_of_mode[r["mode"]]
        row = {"mode": r["mode"], "arm": r["name"], "overrides": " ".join(r["overrides"])}
        if doc is None:
            out.append({**row, "status": "failed"})
            continue
        ref_i = r["ref"] if r["ref"] is not None else None
        ref_doc = docs[ref_i] if ref_i is not None else None
        row["delta_config"] = format_diff(config_diff(ref_doc["config"], doc["config"])) if ref_doc else "(base)"
        m, led = doc.get("metrics", {}), doc.get("ledger", {})
        env_base = docs[base_i]["env"] if docs[base_i] is not None else doc["env"]
        differs = [k for k in ENV_KEYS if doc["env"].get(k) != env_base.get(k)]
        row["env"] = "same as base" if not differs else "differs: " + ", ".join(differs)
        speed_ok = not differs or allow_mixed_env
        steps = led.get("decode_steps") or 0
        if speed_ok:
            row["decode_tokens_per_s"] = m.get("decode_tokens_per_s")
            row["step_ms"] = 1e3 * m["decode_s"] / steps if steps and m.get("decode_s") else None
        for k, v in (led.get("bytes_per_step") or {}).items():
            row[f"bytes_per_step.{k}"] = v
        if q is not None:
            row["bits_per_byte"] = q.get("metrics", {}).get("bits_per_byte")
        row["status"] = "done"
        out.append(row)
    for i, row in enumerate(out):  # ratios once every row has its figures
        r = rows[i]
        base_i = first_of_mode[r["mode"]]
        for name, j in (("vs_base", base_i), ("vs_prev", r["ref"])):
            a, b = row.get("decode_tokens_per_s"), out[j].get("decode_tokens_per_s") if j is not None else None
            row[f"tokens_per_s_{name}"] = a / b if a and b else None
    return out


def run(cfg, run_dir: Path) -> dict:
    import json

    from synodic.distributed.sweep import check_trials, run_sweep, validate_trials
    p = cfg.pipeline
    study = load_study(p.study)
    rows = rows_of(study, list(p.base), p.mode)
    want_quality = study.get("quality", False) if p.quality is None else p.quality
    runs = [r["overrides"] for r in rows]
    if want_quality:
        runs += [[*r["overrides"], "pipeline=eval"] for r in rows]
    trials = validate_trials(runs, "pipeline.study", noun="row", distinct=False)
    uniq = list({t.config_hash: t for t in trials}.values())  # cumulative's last row = leave-one-out's full
    run_sweep(uniq, run_dir, p.cpus, p.gpus, p.max_failures, p.max_concurrent, p.ray_address)

    def doc(t):
        f = Path(run_dir) / "trials" / t.config_hash / "results.json"
        return json.loads(f.read_text()) if f.exists() else None
    docs = [doc(t) for t in trials[:len(rows)]]
    quality = [doc(t) for t in trials[len(rows):]] if want_quality else [None] * len(rows)
    tab = table(rows, docs, quality, p.allow_mixed_env)
    _write(run_dir, tab, p.study)
    out = {"rows": tab, "metrics": {"rows": len(tab), "done": sum(r["status"] == "done" for r in tab)}}
    check_trials([{"overrides": f"arm {r['arm']}", "status": r["status"]} for r in tab], out, "pipeline.study")
    return out


def _write(run_dir: Path, tab: list[dict], study: str) -> None:
    """ablation.md / .csv, and ablation.png: the cumulative rows as a waterfall of decode tokens/s (a bar chart
    of every row when the study has no cumulative rows)."""
    from synodic.results.tables import write_table_files
    first = ["mode", "arm", "delta_config", "decode_tokens_per_s", "tokens_per_s_vs_base", "tokens_per_s_vs_prev",
             "step_ms", "bits_per_byte", "env", "status", "overrides"]
    cum = [r for r in tab if r["mode"] == "cumulative" and r.get("decode_tokens_per_s")]
    write_table_files(run_dir, "ablation", tab, first=first, metric="decode_tokens_per_s", label="arm",
                      title=f"ablation {study}: decode tokens/s per row", plot=len(cum) < 2)
    if len(cum) < 2:  # no waterfall to draw: the bar chart of every row stands in
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(cum) + 2), 4.5))
    prev = 0.0
    for i, r in enumerate(cum):
        v = r["decode_tokens_per_s"]
        bottom, height = (0.0, v) if i == 0 else (min(prev, v), abs(v - prev))
        ax.bar(i, height, bottom=bottom, color="C0" if i == 0 else ("C2" if v >= prev else "C3"))
        ax.text(i, max(prev, v), f"{v:.0f}" + ("" if i == 0 else f"\n{v / prev:.2f}x"), ha="center", va="bottom",
                fontsize=8)
        prev = v
    ax.set_xticks(range(len(cum)), [r["arm"] for r in cum], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("decode tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"ablation {study}: each arm added to the previous row")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "ablation.png", dpi=120)
    plt.close(fig)
