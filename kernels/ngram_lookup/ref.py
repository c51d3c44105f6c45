"""Torch reference of `ngram_hints`: every candidate end j at once, one pass per n-gram length."""
import torch


def ngram_hints_ref(history, rows, anchors, positions, gamma: int, max_ngram: int, min_ngram: int = 1):
    T = history.shape[1]
    dev = history.device
    p = positions.clamp(max=T - 1)
    history[rows, p] = anchors
    tokens = history[rows]                                                   # [B, T]
    j = torch.arange(T, device=dev)[None, :]                                 # candidate end of an earlier n-gram
    at = lambda i: tokens.gather(1, (p - i).clamp(min=0)[:, None])           # noqa: E731  the token at p - i
    match = (j < p[:, None]) & (tokens == at(0))                             # 1-gram hits ending at j < p
    best_j = torch.full_like(p, -1)
    for n in range(1, max_ngram + 1):
        if n > 1:  # the token n - 1 before j matches the one n - 1 before p
            before = torch.cat([torch.zeros_like(tokens[:, :n - 1]), tokens[:, :T - n + 1]], dim=1)
            match = match & (j >= n - 1) & (before == at(n - 1))
        if n < min_ngram:
            continue
        last = torch.where(match, j, -1).amax(-1)                            # latest hit of this length
        best_j = torch.where((n <= p) & (last >= 0), last, best_j)           # a longer n overrides a shorter
    src = best_j[:, None] + 1 + torch.arange(gamma, device=dev)              # [B, gamma]
    valid = (best_j[:, None] >= 0) & (src <= p[:, None])
    return torch.where(valid, tokens.gather(1, src.clamp(max=T - 1)), -1)
