"""pipeline=train_drafter: train the `spec` scheme's draft model (dflash, dspark, dflash2) for the `model`
target, which stays frozen. Data: the target's own continuations (half greedy, half sampled at T = 1) of
prompts drawn from the training split of the embedded corpus; many anchors per sequence, each followed by a
masked block, position-weighted losses (synodic/spec/training.py). Writes the drafter (safetensors + config)
under the run directory, metrics.csv, loss.png, acceptance.png (held-out acceptance rate by draft position)
and, with `export_to`, a copy where `spec.drafter=auto` finds it.

    python run.py pipeline=train_drafter spec=dflash2 model=tiny_gdn pipeline.steps=2000   # GPU: minutes
"""
from pathlib import Path
from typing import Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("pipeline")
class TrainDrafterPipeline(Component):
    kind: Literal["train_drafter"] = "train_drafter"
    steps: int = Field(60, ge=1, description="optimizer steps (the default is CPU-sized; a GPU run takes 2000+)")
    batch: int = Field(8, ge=1, description="sequences per step")
    anchors_per_seq: int = Field(16, ge=1, description="masked blocks trained per sequence per step")
    prompts: int = Field(64, ge=2, description="training prompts drawn from the corpus's training split")
    prompt_len: int = Field(32, ge=2, description="tokens per prompt")
    new_tokens: int = Field(64, ge=8, description="tokens the target continues each prompt with (the training text)")
    eval_prompts: int = Field(16, ge=1, description="held-out prompts for the acceptance report")
    num_layers: int = Field(2, ge=1, description="drafter decoder layers")
    lr: float = Field(6e-4, gt=0, allow_inf_nan=False, description="peak learning rate (AdamW, 4 % warm-up, cosine)")
    decay: float = Field(4.0, gt=0, allow_inf_nan=False, description="position weight w_k = exp(-(k-1)/decay)")
    seed: int = Field(0, description="seed of the prompts, the sampling and the drafter's init")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the target and the drafter run")
    export_to: str | None = Field(None, description="also save the trained drafter in this directory (e.g. "
                                  "synodic/assets/drafters/<model>/<scheme> to ship it as spec.drafter=auto)")


def _prompts(tok, n: int, length: int, heldout: bool, gen):
    """n windows of `length` tokens from random documents of the corpus's train (or held-out) split."""
    import torch

    from synodic.data.corpus import build_corpus, load_heldout
    if heldout:
        ids = tok.encode(load_heldout()[:400_000])
        starts = torch.randint(0, len(ids) - length, (n,), generator=gen).tolist()
        return torch.tensor([ids[s:s + length] for s in starts])
    docs = [d for d in build_corpus().train if len(d.text) > 4 * length]
    out = []
    for i in torch.randint(0, len(docs), (n,), generator=gen).tolist():
        ids = tok.encode(docs[i].text[:20_000])
        while len(ids) <= length:
            ids = ids + ids
        s = int(torch.randint(0, len(ids) - length, (1,), generator=gen))
        out.append(ids[s:s + length])
    return torch.tensor(out)


def run(cfg, run_dir: Path) -> dict:
    import csv

    import torch

    from synodic.config.errors import ConfigError
    from synodic.graph import DTYPES, load_model
    from synodic.models.weights import shipped_dir
    from synodic.spec.models import build_draft_model, save_draft_model
    from synodic.spec.training import continuations, greedy_acceptance, random_anchors, train_steps
    p, scheme = cfg.pipeline, cfg.spec.kind
    if scheme not in ("dflash", "dspark", "dflash2"):
        raise ConfigError([f"spec={scheme} with pipeline=train_drafter: expected spec=dflash, dspark or dflash2 "
                           f"(a scheme with a draft model)"])
    ckpt = shipped_dir(cfg.model.kind)
    if ckpt is None:
        raise ConfigError([f"model={cfg.model.kind} with pipeline=train_drafter: expected a model with shipped "
                           f"weights and tokenizer (tiny_mamba2, tiny_gdn): a drafter learns a trained target"])
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if p.device == "auto" else p.device)
    torch.manual_seed(p.seed)
    target, _ = load_model(cfg.model, device, DTYPES[cfg.model.dtype])
    from synodic.data.tokenizer import load_tokenizer
    tok = load_tokenizer(ckpt / "tokenizer.json")
    gen = torch.Generator().manual_seed(p.seed)
    gamma = cfg.spec.num_speculative_tokens
    train_p = _prompts(tok, p.prompts, p.prompt_len, False, gen).to(device)
    half = p.prompts // 2
    data = torch.cat([continuations(target, train_p[:half], p.new_tokens, 0.0),
                      continuations(target, train_p[half:], p.new_tokens, 1.0,
                                    torch.Generator(device=device).manual_seed(p.seed))]).cpu()
    held = continuations(target, _prompts(tok, p.eval_prompts, p.prompt_len, True, gen).to(device),
                         p.new_tokens, 0.0).cpu()
    draft = build_draft_model(scheme, target.config, target=target, num_layers=p.num_layers, gamma=gamma,
                              seed=p.seed).to(device)
    rows = []
    with open(Path(run_dir) / "metrics.csv", "w", newline="") as f:
        w = None
        for h in train_steps(draft, target, data, p.steps, p.batch, p.anchors_per_seq, gamma, p.decay, p.lr,
                             p.seed, log=lambda h: print(f"step {h['step']}/{p.steps} loss {h['loss']:.4f}",
                                                         flush=True) if h["step"] % 50 == 0 else None):
            if w is None:
                w = csv.DictWriter(f, fieldnames=list(h))
                w.writeheader()
            w.writerow(h)
            rows.append(h)
    draft.eval()
    anchors = random_anchors(held.shape[0], held.shape[1], 8, gamma, gen, device)
    anchors = anchors.clamp(min=p.prompt_len - 1)  # blocks over the target's own continuation
    with torch.no_grad():
        acc = greedy_acceptance(draft, target, held.to(device), anchors, gamma)
    out_dir = save_draft_model(draft, Path(run_dir) / "drafter")
    if p.export_to:
        save_draft_model(draft, p.export_to)
    _plots(run_dir, rows, acc, scheme, cfg.model.kind)
    print(f"{scheme} for {cfg.model.kind}: held-out greedy acceptance length {acc['acceptance_length']:.2f} "
          f"(γ = {gamma}); by position " + " ".join(f"{r:.2f}" for r in acc["rate_by_position"]))
    return {"metrics": {"final_loss": rows[-1]["loss"], "acceptance_length": acc["acceptance_length"],
                        "rate_by_position": acc["rate_by_position"]},
            "drafter": str(out_dir), "exported_to": p.export_to}


def _plots(run_dir, rows, acc, scheme, model) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set_xlabel("step")
    ax.set_ylabel("position-weighted loss")
    ax.set_title(f"{scheme} drafter for {model}: training loss")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "loss.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    k = list(range(1, len(acc["rate_by_position"]) + 1))
    ax.bar(k, acc["rate_by_position"])
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (held-out, greedy)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{scheme} for {model}: acceptance length {acc['acceptance_length']:.2f}")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "acceptance.png", dpi=120)
    plt.close(fig)
