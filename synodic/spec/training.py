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
    h, idx, labels, prev, logits_t = _blocks(draft, target, tokens, anchors, gamma)
    B, A = anchors.shape
    anchor_tok = tokens.gather(1, anchors)
    drafts, _ = draft.decode(h.flatten(0, 1), anchor_tok.flatten(), torch.zeros(B * A, device=tokens.device))
    match = drafts == logits_t.argmax(-1).flatten(0, 1)
    run = match.long().cumprod(-1)                                        # 1 while every earlier draft matched
    accepted = run.sum(-1)
    reach = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], dim=1).sum(0).clamp(min=1)
    return {"acceptance_length": (accepted.float() + 1).mean().item(),
            "rate_by_position": (run.sum(0).float() / reach.float()).tolist()}


def train_steps(draft, target, data: torch.Tensor, steps: int, batch: int, anchors_per_seq: int, gamma: int,
                decay: float = 4.0, lr: float = 6e-4, seed: int = 0, log=None) -> list[dict]:
    """AdamW with warm-up (4 %) and cosine decay, grad-norm 1.0; returns the per-step stats."""
    for p in target.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    warm = max(1, int(0.04 * steps))
    history = []
    for step in range(steps):
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
    return history
