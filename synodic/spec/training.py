"""Drafter training core (target frozen): the target's own continuations as data, many anchors per sequence in one
forward (target hidden states computed once per sequence), position-weighted losses per scheme, and teacher-forced
greedy acceptance by draft position."""
import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def continuations(target, prompts: torch.Tensor, new_tokens: int, temperature: float,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """prompts [N, P] → [N, P + new_tokens]: the target's greedy (temperature 0) or sampled continuation
    (a plain batched full-recompute loop: simple and exact, fine for the tiny targets)."""
    seq = prompts
    for _ in range(new_tokens):
        logits = target(seq)[:, -1].float()
        if temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return seq


def position_weights(gamma: int, decay: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / decay), k = 1..gamma."""
    return torch.exp(-torch.arange(gamma, device=device, dtype=torch.float32) / decay)


def _blocks(draft, target, tokens, anchors, gamma):
    with torch.no_grad():
        logits_t, hidden = target(tokens, hidden_layers=draft.target_layers)
    h = draft.train_blocks(hidden, tokens, anchors, gamma)                 # [B, A, g, H]
    idx = anchors[:, :, None] + torch.arange(1, gamma + 1, device=tokens.device)
    B = tokens.shape[0]
    rows = torch.arange(B, device=tokens.device)[:, None, None]
    return h, idx, tokens[rows, idx], tokens[rows, idx - 1], logits_t[rows, idx - 1].float()


def random_anchors(B: int, T: int, per_seq: int, gamma: int, generator, device) -> torch.Tensor:
    """Anchors in [1, T - gamma): every block has context before it and labels inside the sequence."""
    return torch.randint(1, T - gamma, (B, per_seq), generator=generator).to(device)


def drafter_loss(draft, target, tokens, anchors, gamma: int, decay: float) -> tuple[torch.Tensor, dict]:
    """Position-weighted loss of one batch. dflash: CE; dflash2: CE of the path selector's scores + CE of the
    backbone's logits (its top-K are the candidates); dspark: 0.1 CE + 0.9 TV(p_draft, p_target) + BCE of the
    confidence head toward 1 - TV (the acceptance probability at T = 1)."""
    h, idx, labels, prev, logits_t = _blocks(draft, target, tokens, anchors, gamma)
    out = draft.train_logits(h, prev)
    w = position_weights(gamma, decay, tokens.device)
    wmean = lambda x: (x * w).sum(-1).mean() / w.sum()  # noqa: E731
    ce = wmean(F.cross_entropy(out["draft"].flatten(0, 2), labels.flatten(), reduction="none").view_as(labels))
    stats = {"ce": ce.item()}
    if draft.scheme == "dflash":
        loss = ce
    elif draft.scheme == "dflash2":
        base = wmean(F.cross_entropy(out["base"].flatten(0, 2), labels.flatten(), reduction="none").view_as(labels))
        loss = ce + base
        stats["base_ce"] = base.item()
    else:
        tv = 0.5 * (torch.softmax(out["draft"], -1) - torch.softmax(logits_t, -1)).abs().sum(-1)
        bce = F.binary_cross_entropy_with_logits(out["conf"].float(), (1 - tv).detach(), reduction="none")
        loss = 0.1 * ce + 0.9 * wmean(tv) + wmean(bce)
        stats.update(tv=wmean(tv).item(), bce=wmean(bce).item())
    stats["loss"] = loss.item()
    return loss, stats


@torch.no_grad()
def greedy_acceptance(draft, target, tokens, anchors, gamma: int) -> dict:
    """Teacher-forced greedy acceptance on the target's greedy continuations `tokens`: block a drafts greedily
    from the true prefix; drafts are accepted while they equal the target's argmax (= the next true token).
    Returns the mean acceptance length (accepted + 1) and the conditional acceptance rate per position."""
    return runs_acceptance(_greedy_runs(draft, target, tokens, anchors, gamma))


def runs_acceptance(run: torch.Tensor) -> dict:
    """[blocks, gamma] runs (1 while every earlier draft matched) → the mean acceptance length and the conditional
    rate by position (kept at k among the blocks that reached k)."""
    accepted = run.sum(-1)
    reach = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], dim=1).sum(0).clamp(min=1)
    return {"acceptance_length": (accepted.float() + 1).mean().item(),
            "rate_by_position": (run.sum(0).float() / reach.float()).tolist()}


def _ngram_drafts(tokens: torch.Tensor, anchors: torch.Tensor, gamma: int, max_ngram: int, min_ngram: int):
    """(row, anchor, drafts) of every block of anchors [B, A], in the flattened order of a [B * A] result: spec=ngram's
    prompt lookup from tokens[row, :anchor + 1]."""
    from .ngram import lookup
    toks = tokens.cpu().tolist()
    return [(r, a, lookup(toks[r][:a + 1], gamma, max_ngram, min_ngram))
            for r, row in enumerate(anchors.cpu().tolist()) for a in row]


@torch.no_grad()
def ngram_runs(target, tokens: torch.Tensor, anchors: torch.Tensor, gamma: int, max_ngram: int,
               min_ngram: int) -> torch.Tensor:
    """spec=ngram's teacher-forced runs [B * A, gamma], as _greedy_runs gives a drafter's: block (b, a) drafts by
    prompt lookup from tokens[b, :a + 1] and keeps drafts while they equal the target's argmax; a lookup shorter
    than gamma (or none) ends the run where its drafts end, as a row with fewer drafts does in the Engine."""
    argmax = target(tokens).argmax(-1).cpu()
    out = torch.zeros(anchors.numel(), gamma, dtype=torch.long)
    for i, (b, a, d) in enumerate(_ngram_drafts(tokens, anchors, gamma, max_ngram, min_ngram)):
        for k, tok in enumerate(d):
            if tok != int(argmax[b, a + k]):
                break
            out[i, k] = 1
    return out


def _greedy_runs(draft, target, tokens, anchors, gamma: int) -> torch.Tensor:
    """[B * A, gamma] long: 1 at draft k of block (b, a) while drafts 1..k all equal the target's argmax."""
    h, idx, labels, prev, logits_t = _blocks(draft, target, tokens, anchors, gamma)
    B, A = anchors.shape
    anchor_tok = tokens.gather(1, anchors)
    drafts, _ = draft.decode(h.flatten(0, 1), anchor_tok.flatten(), None)  # greedy drafts
    return (drafts == logits_t.argmax(-1).flatten(0, 1)).long().cumprod(-1)


@torch.no_grad()
def walk_acceptance(draft, target, tokens, prompt_len: int, gamma: int, chunk: int = 8) -> dict:
    """The acceptance a greedy decode gets, not a random anchor's: tokens [B, T] are prompts of prompt_len
    tokens and their greedy continuations; each row is walked as the Engine steps it (anchor = the last
    committed token, first the prefill's token at prompt_len; draft gamma, keep the matching prefix + 1 target
    token, move the anchor past them) until it holds max_tokens = T - prompt_len - gamma + 1 tokens (the last
    block still has all its labels). Teacher-forced drafts at every anchor in one pass per `chunk` rows; the
    walk picks the anchors it reaches. Returns tokens_per_step (the Engine's mean of accepted + 1 over its
    row-steps), steps, max_tokens and the conditional rate by position over the reached blocks."""
    B, T = tokens.shape
    anchors = walk_anchors(tokens, prompt_len, gamma)  # the last verifies the final max_tokens-th token
    runs = torch.cat([_greedy_runs(draft, target, tokens[i:i + chunk], anchors[i:i + chunk], gamma).view(
        -1, anchors.shape[1], gamma) for i in range(0, B, chunk)]).cpu()
    return walk_runs(runs, prompt_len, T, gamma)


def walk_anchors(tokens: torch.Tensor, prompt_len: int, gamma: int) -> torch.Tensor:
    """[B, n] every anchor a greedy decode of tokens [B, T] can verify from (walk_acceptance)."""
    B, T = tokens.shape
    last = T - gamma - 1
    if last < prompt_len:
        raise ValueError(f"walk_acceptance: sequences of {T} tokens with prompt_len={prompt_len} and gamma={gamma}; "
                         f"expected T >= prompt_len + gamma + 1")
    return torch.arange(prompt_len, last + 1, device=tokens.device).expand(B, -1)


def walk_runs(runs: torch.Tensor, prompt_len: int, T: int, gamma: int) -> dict:
    """walk_acceptance's walk over teacher-forced runs [B, n anchors, gamma] at walk_anchors."""
    last = T - gamma - 1
    kept, reached = [], []
    for row in runs:
        a = prompt_len
        while a <= last:
            run = row[a - prompt_len]
            reached.append(run)
            kept.append(int(run.sum()) + 1)
            a += kept[-1]
    run = torch.stack(reached)
    reach = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], dim=1).sum(0).clamp(min=1)
    return {"tokens_per_step": sum(kept) / len(kept), "steps": len(kept), "max_tokens": T - prompt_len - gamma + 1,
            "rate_by_position": (run.sum(0).float() / reach.float()).tolist()}


@torch.no_grad()
def calibrate_confidence(draft, target, tokens, gamma: int, seed: int = 0, anchors_per_seq: int = 16) -> list[float]:
    """DSpark: per-position temperature scaling of the confidence head, fit after training: T_k minimises the
    BCE of sigmoid(z_k / T_k) against the soft acceptance label 1 - TV(p_draft, p_target) on teacher-forced
    blocks (a grid over T in [0.05, 20], log-spaced: one parameter per position, no optimiser needed). Sets
    and returns confidence.temperature."""
    g = torch.Generator().manual_seed(seed + 7)
    anchors = random_anchors(tokens.shape[0], tokens.shape[1], anchors_per_seq, gamma, g, tokens.device)
    h, idx, labels, prev, logits_t = _blocks(draft, target, tokens, anchors, gamma)
    out = draft.train_logits(h, prev)
    y = 1 - 0.5 * (torch.softmax(out["draft"], -1) - torch.softmax(logits_t, -1)).abs().sum(-1)
    z = out["conf"].float()
    grid = torch.logspace(math.log10(0.05), math.log10(20.0), 121, device=z.device)
    temps = []
    for k in range(gamma):
        zk, yk = z[..., k].flatten(), y[..., k].flatten()
        bce = torch.stack([F.binary_cross_entropy_with_logits(zk / t, yk) for t in grid])
        temps.append(float(grid[bce.argmin()]))
    draft.confidence.temperature.copy_(torch.tensor(temps, device=draft.confidence.temperature.device))
    return temps


@torch.no_grad()
def sampled_acceptance(draft, target, tokens, anchors, gamma: int, temperature: float = 1.0) -> dict:
    """Teacher-forced expected acceptance under speculative sampling at `temperature` (drafts drawn from q, kept
    with probability min(1, p/q)): at block position k the acceptance probability is
    alpha_k = sum_v min(p_k(v), q_k(v)) = 1 - TV(p_k, q_k), with p the target's and q the drafter's distribution
    given the true prefix (the Markov head / path selector conditioned on the true previous token, DFlash2's q
    over its top-K candidates as at decode). Expected length = 1 + sum_k prod_{i<=k} alpha_i."""
    h, idx, labels, prev, logits_t = _blocks(draft, target, tokens, anchors, gamma)
    out = draft.train_logits(h, prev)
    d = out["draft"]
    if draft.scheme == "dflash2":  # decode samples only among the backbone's top-K
        k = min(draft.selector.k, d.shape[-1])
        keep = torch.zeros_like(d, dtype=torch.bool).scatter_(-1, out["base"].topk(k, dim=-1).indices, True)
        d = d.masked_fill(~keep, float("-inf"))
    q = torch.softmax(d / temperature, -1)
    p = torch.softmax(logits_t / temperature, -1)
    alpha = torch.minimum(p, q).sum(-1).flatten(0, 1)                     # [B*A, gamma]
    surv = alpha.cumprod(-1)
    return {"acceptance_length": (1 + surv.sum(-1)).mean().item(),
            "rate_by_position": alpha.mean(0).tolist()}


@torch.no_grad()
def ngram_sampled_acceptance(target, tokens, anchors, gamma: int, max_ngram: int, min_ngram: int,
                             temperature: float = 1.0) -> dict:
    """sampled_acceptance for spec=ngram: its q is one-hot on the looked-up draft, so draft k is kept with
    probability alpha_k = p_k(d_k) (0 past the end of the lookup), p the target's at `temperature` given the
    true prefix of the sampled sequences `tokens`."""
    p = torch.softmax(target(tokens).float() / temperature, -1).cpu()
    alpha = torch.zeros(anchors.numel(), gamma)
    for i, (b, a, d) in enumerate(_ngram_drafts(tokens, anchors, gamma, max_ngram, min_ngram)):
        for k, tok in enumerate(d):
            alpha[i, k] = p[b, a + k, tok]
    return {"acceptance_length": (1 + alpha.cumprod(-1).sum(-1)).mean().item(),
            "rate_by_position": alpha.mean(0).tolist()}


def train_steps(draft, target, data: torch.Tensor, steps: int, batch: int, anchors_per_seq: int, gamma: int,
                decay: float = 4.0, lr: float = 6e-4, seed: int = 0, log=None, ckpt_dir=None, ckpt_every: int = 0,
                halt_at: int | None = None) -> list[dict]:
    """AdamW with warm-up (4 %) and cosine decay, grad-norm 1.0; returns the per-step stats.

    With `ckpt_dir`, the drafter, the optimiser, the batch sampler's RNG and the history are saved there every
    `ckpt_every` steps and at the end (synodic/train/state.py: safetensors + JSON, no pickle), and a run that
    finds a checkpoint there continues from it: the resumed run draws the same batches and reaches the same
    weights as an uninterrupted one. `halt_at` stops after that step (a checkpoint is written), as a crash would."""
    from synodic.train.state import has_state, load_state, save_state
    for p in target.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    warm = max(1, int(0.04 * steps))
    history: list[dict] = []
    done = 0
    if ckpt_dir is not None and has_state(ckpt_dir):
        st = load_state(ckpt_dir)
        if st["steps"] != steps:
            raise ValueError(f"{ckpt_dir}: checkpoint of a {st['steps']}-step schedule, this run has {steps}")
        draft.load_state_dict({k: v.to(p.device, p.dtype) for (k, v), p in
                               zip(st["draft"].items(), draft.state_dict().values())})
        opt.load_state_dict(st["opt"])
        g.set_state(st["rng"])
        history, done = st["history"], st["step"]

    def save(step):
        if ckpt_dir is not None:
            save_state({"draft": draft.state_dict(), "opt": opt.state_dict(), "rng": g.get_state(), "step": step,
                        "steps": steps, "history": history}, ckpt_dir)

    for step in range(done, steps):
        f = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr * f
        rows = torch.randint(0, data.shape[0], (batch,), generator=g)
        tokens = data[rows].to(next(draft.parameters()).device)
        anchors = random_anchors(batch, tokens.shape[1], anchors_per_seq, gamma, g, tokens.device)
        loss, stats = drafter_loss(draft, target, tokens, anchors, gamma, decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        history.append({"step": step + 1, **stats})
        if log is not None:
            log(history[-1])
        if ckpt_every and (step + 1) % ckpt_every == 0 and step + 1 < steps:
            save(step + 1)
        if halt_at is not None and step + 1 >= halt_at:
            save(step + 1)
            return history
    save(steps)
    return history
