"""pipeline=train_drafter: train the `spec` scheme's draft model (dflash, dspark, dflash2) for the `model`
target, which stays frozen. Data: the target's own continuations (greedy; `sampled_fraction` of them sampled at
T = 1) of prompts drawn from the training split of the embedded corpus; many anchors per sequence, each followed by a
masked block, position-weighted losses (synodic/spec/training.py). Writes the drafter (safetensors + config)
under the run directory, metrics.csv, loss.png, acceptance.png (held-out acceptance rate by draft position)
and, with `export_to`, a copy where `spec.drafter=auto` finds it. The report gives the teacher-forced acceptance at
random anchors of the held-out continuations and the tokens per step a greedy decode of the held-out prompts gets
(walk_tokens_per_step: anchored where the Engine's steps anchor, synodic.spec.training.walk_acceptance).

    python run.py pipeline=train_drafter spec=dflash2 model=tiny_gdn pipeline.steps=2000   # GPU: minutes
"""
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from synodic.config.registry import Component, register


@register("pipeline")
class TrainDrafterPipeline(Component):
    kind: Literal["train_drafter"] = "train_drafter"
    steps: int = Field(1500, ge=1, description="optimizer steps (GPU-sized: about a minute on an H200)")
    batch: int = Field(32, ge=1, description="sequences per step")
    anchors_per_seq: int = Field(32, ge=1, description="masked blocks trained per sequence per step")
    prompts: int = Field(2048, ge=2, description="training prompts drawn from the corpus's training split (a few "
                         "dozen overfit: held-out acceptance 1.2 at train acceptance 5.5, docs/speculative.md)")
    prompt_len: int = Field(32, ge=2, description="tokens per prompt")
    new_tokens: int = Field(96, ge=8, description="tokens the target continues each prompt with (the training text)")
    sampled_fraction: float = Field(0.0, ge=0, le=1, description="share of the prompts continued by sampling at "
                                    "T = 1 (the rest greedily)")
    eval_prompts: int = Field(64, ge=1, description="held-out prompts for the acceptance report")
    num_layers: int = Field(2, ge=1, description="drafter decoder layers")
    intermediate_size: int = Field(384, ge=1, description="drafter MLP width (384: the six shipped fp8 drafters "
                                   "stay under 16 MiB together)")
    head_rank: int = Field(64, ge=1, description="rank of DSpark's Markov head / DFlash2's path selector")
    lookup_hint: int = Field(4, ge=0, description="prompt-lookup hints at the mask slots (longest suffix matched); "
                             "0 = none")
    lr: float = Field(2e-3, gt=0, allow_inf_nan=False, description="peak learning rate (AdamW, 4 % warm-up, cosine)")
    decay: float = Field(4.0, gt=0, allow_inf_nan=False, description="position weight w_k = exp(-(k-1)/decay)")
    seed: int = Field(0, description="seed of the prompts, the sampling and the drafter's init")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the target and the drafter run")
    storage: Literal["fp8", "bfloat16", "float32"] = Field("fp8", description="how the saved drafter's matrices "
                                                         "are stored (fp8: e4m3 + a scale per output row)")
    ckpt_every: int = Field(250, ge=0, description="steps between checkpoints in <run dir>/ckpt (0: only at the "
                            "end); a re-run in the same run directory resumes from it")
    export_to: str | None = Field(None, description="also save the trained drafter in this directory (e.g. "
                                  "synodic/assets/drafters/<model>/<scheme> to ship it as spec.drafter=auto)")

    @field_validator("export_to")
    @classmethod
    def _export_to(cls, v: str | None) -> str | None:  # checked before the training it would fail after
        from synodic.config.files import writable_dir_or_none
        return writable_dir_or_none(v)


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
        ids = tok.encode(docs[i].text[:4000])
        while len(ids) <= length:
            ids = ids + ids
        s = int(torch.randint(0, len(ids) - length, (1,), generator=gen))
        out.append(ids[s:s + length])
    return torch.tensor(out)


def _data(target, tok, p, device, run_dir: Path, model: str = ""):
    """Training and held-out sequences (the target's own continuations), cached in the run directory so a
    resumed run trains on the very same text."""
    import torch
    from safetensors.torch import save_file

    from synodic.spec.training import continuations
    cache = Path(run_dir) / "data.safetensors"
    made_by = {f"pipeline.{k}": str(getattr(p, k)) for k in DATA_KEYS} | {"model": model}
    if cache.is_file():
        return _cached(cache, made_by)
    gen = torch.Generator().manual_seed(p.seed)
    train_p, held_p = _split_prompts(tok, p, gen)
    n_g = p.prompts - int(round(p.prompts * p.sampled_fraction))
    sgen = torch.Generator(device=device).manual_seed(p.seed)
    chunks = []
    for lo, hi, temp in [(i, min(i + 512, n_g), 0.0) for i in range(0, n_g, 512)] + \
            [(i, min(i + 512, p.prompts), 1.0) for i in range(n_g, p.prompts, 512)]:
        # minutes on a CPU: a line per chunk of prompts the target continues
        print(f"training data: continuing prompts {lo}-{hi} of {p.prompts} ({'greedy' if temp == 0 else 'sampled'},"
              f" {p.new_tokens} tokens each)", flush=True)
        chunks.append(continuations(target, train_p[lo:hi].to(device), p.new_tokens, temp,
                                    None if temp == 0 else sgen).cpu())
    held, held_s = _held_continuations(target, held_p.to(device), p, sgen)
    train = torch.cat(chunks)
    save_file({"train": train.contiguous(), "held": held, "held_sampled": held_s}, str(cache), metadata=made_by)
    return train, held, held_s


def _split_prompts(tok, p, gen):
    """The training prompts, then the held-out ones, drawn from one generator in that order (so the held-out
    prompts of a recipe are the same whether or not its training continuations are made)."""
    return _prompts(tok, p.prompts, p.prompt_len, False, gen), _prompts(tok, p.eval_prompts, p.prompt_len, True, gen)


def _held_continuations(target, held_p, p, sgen):
    """The target's greedy and sampled (T = 1, from `sgen`) continuations of the held-out prompts."""
    from synodic.spec.training import continuations
    return (continuations(target, held_p, p.new_tokens, 0.0).cpu(),
            continuations(target, held_p, p.new_tokens, 1.0, sgen).cpu())


def heldout_data(target, tok, p, device, gamma: int):
    """(held, held_sampled, anchors): the held-out sequences and γ-blocks' anchors a train_drafter run with recipe `p`
    reports its acceptance on, made without the training continuations (benchmarks.drafter_acceptance scores every
    scheme on them). A sampled training share draws from the sampling generator before the held-out sequences do,
    so only a recipe without one (sampled_fraction = 0, the default) gives the run's own sampled sequences."""
    import torch
    gen = torch.Generator().manual_seed(p.seed)
    _, held_p = _split_prompts(tok, p, gen)
    held, held_s = _held_continuations(target, held_p.to(device), p, torch.Generator(device=device).manual_seed(p.seed))
    return held, held_s, eval_anchors(held, p.prompt_len, p.seed, gamma)


def eval_anchors(held, prompt_len: int, seed: int, gamma: int):
    """16 block anchors per held-out sequence, over the target's own continuation (every block has its labels)."""
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    lo = min(prompt_len - 1, held.shape[1] - gamma - 1)
    return torch.randint(lo, held.shape[1] - gamma, (held.shape[0], 16), generator=g)


# the settings that decide the cached sequences: a rerun in the same directory must ask for the same ones
DATA_KEYS = ("prompts", "prompt_len", "new_tokens", "sampled_fraction", "eval_prompts", "seed")


def _cached(cache: Path, made_by: dict):
    """The cached sequences, when they were made with these settings; a one-line ConfigError otherwise (a resumed
    run must train on the very same text, and another run's data is not this one's)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from synodic.config.errors import ConfigError
    try:
        with safe_open(str(cache), "pt") as f:
            meta = f.metadata() or {}
        d = load_file(str(cache))
        out = d["train"], d["held"], d["held_sampled"]
    except Exception as e:  # (safetensors raises its own error type for a damaged file)
        raise ConfigError([f"hydra.run.dir={cache.parent}: its data.safetensors cannot be read ({_first(e)}); "
                           "expected the file a train_drafter run wrote there (delete it to rebuild the data)"]) \
            from None
    for k, v in made_by.items():
        if k in meta and meta[k] != v:
            raise ConfigError([f"{k}={v}: the run directory's data.safetensors was made with {k}={meta[k]}; "
                               f"expected {k}={meta[k]} to resume that run (or another hydra.run.dir)"])
    return out


def _resumable(ckpt_dir: Path, steps: int, scheme: str, draft) -> int:
    """The step a run resumes from the checkpoint in ckpt_dir: one made by the same schedule and drafter; a
    one-line ConfigError naming what differs otherwise."""
    from synodic.config.errors import ConfigError
    from synodic.train.state import load_state
    try:
        st = load_state(ckpt_dir)
    except ValueError as e:
        raise ConfigError([f"hydra.run.dir={ckpt_dir.parent}: {_first(e)}; expected the checkpoint a train_drafter "
                           "run wrote there (or another hydra.run.dir)"]) from None
    if st.get("steps") != steps:
        raise ConfigError([f"pipeline.steps={steps}: {ckpt_dir} holds a checkpoint of a {st.get('steps')}-step "
                           f"schedule; expected pipeline.steps={st.get('steps')} to resume it (or another "
                           "hydra.run.dir)"])
    want = {k: tuple(v.shape) for k, v in draft.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in st.get("draft", {}).items()}
    if want != have:
        raise ConfigError([f"spec={scheme}: {ckpt_dir} holds a checkpoint of another drafter (another scheme or "
                           "size); expected the spec and pipeline settings of the run that wrote it (or another "
                           "hydra.run.dir)"])
    return st["step"]


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _progress(total: int, start: int):
    """A rich progress bar on a terminal; a plain line every 50 steps otherwise. Returns (log, close)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    console = Console(stderr=True)
    if not console.is_terminal:
        return (lambda h: print(f"step {h['step']}/{total} loss {h['loss']:.4f}", flush=True)
                if h["step"] % 50 == 0 else None), lambda: None
    bar = Progress(TextColumn("train_drafter"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console)
    task = bar.add_task("train", total=total, completed=start, loss="-")
    bar.start()
    return (lambda h: bar.update(task, completed=h["step"], loss=f"{h['loss']:.4f}")), bar.stop


def run(cfg, run_dir: Path) -> dict:
    import csv

    import torch

    from synodic.config.errors import ConfigError
    from synodic.graph import DTYPES, load_model
    from synodic.models.weights import shipped_dir
    from synodic.spec.models import build_draft_model, load_draft_model, save_draft_model
    from synodic.spec.training import greedy_acceptance, sampled_acceptance, train_steps, walk_acceptance
    from synodic.train.state import has_state
    p, scheme = cfg.pipeline, cfg.spec.kind
    if scheme not in ("dflash", "dspark", "dflash2"):
        raise ConfigError([f"spec={scheme} with pipeline=train_drafter: expected spec=dflash, dspark or dflash2 "
                           f"(a scheme with a draft model)"])
    if p.new_tokens <= cfg.spec.num_speculative_tokens:
        raise ConfigError([f"pipeline.new_tokens={p.new_tokens} with spec.num_speculative_tokens="
                           f"{cfg.spec.num_speculative_tokens}: expected pipeline.new_tokens > "
                           f"{cfg.spec.num_speculative_tokens} (a held-out block needs all its labels)"])
    ckpt = shipped_dir(cfg.model.kind)
    if ckpt is None:
        raise ConfigError([f"model={cfg.model.kind} with pipeline=train_drafter: expected a model with shipped "
                           f"weights and tokenizer (tiny_mamba2, tiny_gdn): a drafter learns a trained target"])
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if p.device == "auto" else p.device)
    torch.manual_seed(p.seed)
    target, _ = load_model(cfg.model, device, DTYPES[cfg.model.dtype])
    from synodic.data.tokenizer import load_tokenizer
    tok = load_tokenizer(ckpt / "tokenizer.json")
    gamma = cfg.spec.num_speculative_tokens
    run_dir = Path(run_dir)
    data, held, held_s = _data(target, tok, p, device, run_dir, cfg.model.kind)
    draft = build_draft_model(scheme, target.config, target=target, num_layers=p.num_layers, gamma=gamma,
                              seed=p.seed, intermediate_size=p.intermediate_size, markov_rank=p.head_rank,
                              selector_rank=p.head_rank, lookup_hint=p.lookup_hint,
                              target_kind=cfg.model.kind).to(device)
    ckpt_dir = run_dir / "ckpt"
    start = _resumable(ckpt_dir, p.steps, scheme, draft) if has_state(ckpt_dir) else 0
    if start:
        print(f"resuming from {ckpt_dir} at step {start}", flush=True)
    log, close = _progress(p.steps, start)
    try:
        rows = train_steps(draft, target, data, p.steps, p.batch, p.anchors_per_seq, gamma, p.decay, p.lr, p.seed,
                           log=log, ckpt_dir=ckpt_dir, ckpt_every=p.ckpt_every)
    finally:
        close()
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    draft.eval()
    if scheme == "dspark":
        from synodic.spec.training import calibrate_confidence
        calibrate_confidence(draft, target, data[: max(1, data.shape[0] // 8)].to(device), gamma, p.seed)
    anchors = eval_anchors(held, p.prompt_len, p.seed, gamma).to(device)
    out_dir = save_draft_model(draft, run_dir / "drafter", p.storage)
    stored = load_draft_model(out_dir, target.config, device, next(draft.parameters()).dtype, target=target).eval()
    with torch.no_grad():
        acc = greedy_acceptance(draft, target, held.to(device), anchors, gamma)
        acc_rt = greedy_acceptance(stored, target, held.to(device), anchors, gamma)
        acc_s = sampled_acceptance(stored, target, held_s.to(device), anchors, gamma, 1.0)
        # what a greedy decode of the held-out prompts gets: random anchors over-weight the long stretches where
        # a tiny target loops (easy to draft), a decode spends most of its steps outside them
        walk = walk_acceptance(stored, target, held.to(device), p.prompt_len, gamma)
    if p.export_to:
        save_draft_model(draft, p.export_to, p.storage)
    _plots(run_dir, rows, acc_rt, scheme, cfg.model.kind)
    print(f"{scheme} for {cfg.model.kind}: held-out acceptance length (γ = {gamma}) greedy "
          f"{acc['acceptance_length']:.2f}, after the {p.storage} round trip {acc_rt['acceptance_length']:.2f}, "
          f"sampled T=1 {acc_s['acceptance_length']:.2f}; greedy by position "
          + " ".join(f"{r:.2f}" for r in acc_rt["rate_by_position"])
          + f"; a greedy decode's walk {walk['tokens_per_step']:.2f} tokens/step ({walk['steps']} row-steps, "
          f"{p.eval_prompts} prompts x {walk['max_tokens']} tokens)", flush=True)
    return {"metrics": {"final_loss": rows[-1]["loss"], "acceptance_length": acc_rt["acceptance_length"],
                        "acceptance_length_unquantized": acc["acceptance_length"],
                        "rate_by_position": acc_rt["rate_by_position"],
                        "sampled_acceptance_length": acc_s["acceptance_length"],
                        "sampled_rate_by_position": acc_s["rate_by_position"],
                        "walk_tokens_per_step": walk["tokens_per_step"], "walk_steps": walk["steps"],
                        "walk_max_tokens": walk["max_tokens"], "walk_rate_by_position": walk["rate_by_position"],
                        "drafter_bytes": (out_dir / "model.safetensors").stat().st_size},
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
