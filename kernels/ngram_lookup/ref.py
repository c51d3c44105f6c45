"""Torch reference of `ngram_hints`: every candidate end j at once, one pass per n-gram length."""
import torch


def lookup_hints_ref(tokens, anchor_pos, gamma: int, max_ngram: int, min_ngram: int = 1):
    """tokens [B, T], anchor_pos [B, A] → hints [B, A, gamma] long (-1: none): for each anchor p, the tokens that
    followed the latest earlier occurrence of the longest suffix of tokens[:p + 1] (max_ngram down to min_ngram
    tokens); only positions <= p are read."""
    B, T = tokens.shape
    dev = tokens.device
    p = anchor_pos[:, :, None]                                               # [B, A, 1]
    j = torch.arange(T, device=dev)                                          # candidate end of an earlier n-gram
    at = lambda i: tokens.gather(1, (anchor_pos - i).clamp(min=0))[:, :, None]  # noqa: E731  the token at p - i
    match = (j < p) & (tokens[:, None, :] == at(0))                          # 1-gram hits ending at j < p
    best_j = torch.full_like(anchor_pos, -1)
    for n in range(1, min(max_ngram, T) + 1):  # (no n-gram longer than the row ends at some j >= n - 1)
        if n > 1:  # the token n - 1 before j matches the one n - 1 before p
            before = torch.cat([torch.zeros_like(tokens[:, :n - 1]), tokens[:, :T - n + 1]], dim=1)
            match = match & (j >= n - 1) & (before[:, None, :] == at(n - 1))
        if n < min_ngram:
            continue
        last = torch.where(match, j, -1).amax(-1)                            # latest hit of this length
        ok = (n <= anchor_pos) & (last >= 0)                                 # (a suffix of n needs n <= p)
        best_j = torch.where(ok, last, best_j)                               # a longer n overrides a shorter
    src = best_j[:, :, None] + 1 + torch.arange(gamma, device=dev)           # [B, A, gamma]
    valid = (best_j[:, :, None] >= 0) & (src <= p)
    got = tokens.gather(1, src.clamp(max=T - 1).flatten(1)).view_as(src)
    return torch.where(valid, got, -1)


def ngram_hints_ref(history, rows, anchors, positions, gamma: int, max_ngram: int, min_ngram: int = 1):
    p = positions.clamp(max=history.shape[1] - 1)
    history[rows, p] = anchors
    return lookup_hints_ref(history[rows], p[:, None], gamma, max_ngram, min_ngram)[:, 0]
