"""Held-out acceptance of every speculative scheme on one set of blocks (BENCHMARKS.md S1): for each embedded
target, the held-out sequences and block anchors that `pipeline=train_drafter` reports on (its recipe's defaults,
conf/pipeline/train_drafter.yaml), scored teacher-forced for spec=ngram and for the shipped dflash / dspark /
dflash2 drafters (the files `spec.drafter=auto` loads). Acceptance is a property of the drafts, not of the device,
so a CPU run gives the figure (in minutes).

    python -m benchmarks.drafter_acceptance --out drafter_acceptance.json [--models tiny_gdn] [--schemes ngram dspark]

Per (target, scheme): the greedy acceptance length (accepted drafts + 1) at the recipe's random anchors and its
conditional rate by position, the tokens per step a greedy decode's walk of the held-out prompts gets (anchored
where the Engine's steps anchor), and the expected acceptance length under sampling at T = 1."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks._cli import out_file, positive_int

SCHEMES = ("ngram", "dflash", "dspark", "dflash2")


def score(scheme: str, model: str, target, held, held_s, anchors, gamma: int, prompt_len: int, device) -> dict:
    """One scheme's three acceptance figures on the given blocks."""
    from synodic.config.compose import compose
    from synodic.spec.training import (
        greedy_acceptance,
        ngram_runs,
        ngram_sampled_acceptance,
        runs_acceptance,
        sampled_acceptance,
        walk_acceptance,
        walk_anchors,
        walk_runs,
    )
    held, held_s, anchors = held.to(device), held_s.to(device), anchors.to(device)
    if scheme == "ngram":
        n = compose(["spec=ngram"]).spec
        look = (gamma, n.max_ngram, n.min_ngram)
        greedy = runs_acceptance(ngram_runs(target, held, anchors, *look))
        sampled = ngram_sampled_acceptance(target, held_s, anchors, *look)
        wa = walk_anchors(held, prompt_len, gamma)
        walk = walk_runs(ngram_runs(target, held, wa, *look).view(*wa.shape, gamma), prompt_len, held.shape[1], gamma)
        return {"greedy": greedy, "sampled": sampled, "walk": walk}
    from synodic.spec.models import load_draft_model, shipped_drafter_dir
    draft = load_draft_model(shipped_drafter_dir(model, scheme), target.config, device, torch.float32,
                             target=target).eval()
    return {"greedy": greedy_acceptance(draft, target, held, anchors, gamma),
            "sampled": sampled_acceptance(draft, target, held_s, anchors, gamma, 1.0),
            "walk": walk_acceptance(draft, target, held, prompt_len, gamma)}


def _check_drafters(ap, models, schemes, gamma: int) -> None:
    """Every asked-for drafter is shipped and drafts blocks of --gamma, before any work (one line, exit 2)."""
    from synodic.spec.models import shipped_drafter_dir
    for m in models:
        for s in schemes:
            if s == "ngram":
                continue
            d = shipped_drafter_dir(m, s)
            if d is None:
                ap.error(f"argument --schemes: {s} for {m}: no shipped drafter; expected one of synodic/assets/"
                         f"drafters/{m}/<scheme>")
            g = json.loads((d / "config.json").read_text()).get("gamma")
            if g != gamma:
                ap.error(f"argument --gamma: invalid value {gamma}; the shipped {s} drafter for {m} drafts blocks "
                         f"of {g}, expected --gamma {g}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default=Path("drafter_acceptance.json"))
    ap.add_argument("--models", nargs="+", default=["tiny_mamba2", "tiny_gdn"], choices=["tiny_mamba2", "tiny_gdn"])
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    ap.add_argument("--gamma", type=positive_int, default=7, help="block length (the shipped drafters': 7)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--prompts", type=positive_int, help="held-out prompts (default: the recipe's eval_prompts)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("argument --device: invalid choice 'cuda'; expected cpu (no CUDA device here)")
    _check_drafters(ap, a.models, a.schemes, a.gamma)
    from synodic.pipelines.train_drafter import heldout_data

    from synodic.config.compose import compose
    from synodic.data.tokenizer import load_tokenizer
    from synodic.graph import DTYPES, load_model
    from synodic.models.weights import shipped_dir
    device = torch.device(a.device)
    rows = []
    for m in a.models:
        cfg = compose([f"model={m}", "pipeline=train_drafter", "spec=dflash2"])
        p = cfg.pipeline if a.prompts is None else cfg.pipeline.model_copy(update={"eval_prompts": a.prompts})
        torch.manual_seed(p.seed)
        target, _ = load_model(cfg.model, device, DTYPES[cfg.model.dtype])
        target.eval()
        tok = load_tokenizer(shipped_dir(m) / "tokenizer.json")
        print(f"{m}: the target continues {p.eval_prompts} held-out prompts ({p.new_tokens} tokens, greedy and "
              f"sampled)", flush=True)
        with torch.no_grad():
            held, held_s, anchors = heldout_data(target, tok, p, device, a.gamma)
        for s in a.schemes:
            with torch.no_grad():
                r = score(s, m, target, held, held_s, anchors, a.gamma, p.prompt_len, device)
            row = {"model": m, "scheme": s, "acceptance_length": r["greedy"]["acceptance_length"],
                   "walk_tokens_per_step": r["walk"]["tokens_per_step"],
                   "sampled_acceptance_length": r["sampled"]["acceptance_length"],
                   "rate_by_position": r["greedy"]["rate_by_position"], "walk_steps": r["walk"]["steps"],
                   "sampled_rate_by_position": r["sampled"]["rate_by_position"]}
            rows.append(row)
            print(f"  {s:>8}: greedy {row['acceptance_length']:.2f}, walk {row['walk_tokens_per_step']:.2f} tokens/"
                  f"step, sampled T=1 {row['sampled_acceptance_length']:.2f}; by position "
                  + " ".join(f"{x:.2f}" for x in row["rate_by_position"]), flush=True)
    out = {"gamma": a.gamma, "device": str(device), "blocks": "pipeline=train_drafter's held-out blocks (16 anchors "
           "a prompt)", "rows": rows, "ratios": ratios(rows)}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for m, figs in out["ratios"].items():
        for fig, r in figs.items():
            print(f"{m}, {fig}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    print(f"wrote {a.out}")


def ratios(rows: list[dict]) -> dict:
    """Per target and figure (greedy acceptance length at random anchors, a greedy decode's tokens per step), the
    ratios of the drafter issue's ordering (DFlash2 ≥ DSpark ≥ 1.1x DFlash > ngram) among the schemes scored."""
    pairs = [("dflash2/dspark", "dflash2", "dspark"), ("dspark/dflash", "dspark", "dflash"),
             ("dflash/ngram", "dflash", "ngram")]
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        for fig, key in (("greedy", "acceptance_length"), ("walk", "walk_tokens_per_step")):
            v = {r["scheme"]: r[key] for r in rows if r["model"] == m}
            out.setdefault(m, {})[fig] = {name: v[x] / v[y] for name, x, y in pairs if x in v and y in v}
    return out


if __name__ == "__main__":
    main()
