"""Prompt-lookup hints for the neural drafters: for a block anchored at position p, the tokens that followed the
latest earlier occurrence of the context's longest suffix (max_ngram down to min_ngram tokens) — exactly what
spec=ngram would propose (synodic/spec/ngram.py: lookup) — fed to the block's mask slots as extra input.

Why: the embedded targets' continuations repeat themselves (prompt lookup alone accepts ~3.5-4 tokens per verify
on them), and a two-layer drafter whose context rows are the target's features cannot learn an induction copy
(match the anchor, then read k positions later) from a few thousand steps; with the lookup's tokens at its
inputs it only has to learn when to trust them and what to draft where the lookup has nothing or is wrong."""
import torch

from synodic.spec.ngram import lookup


def lookup_hints(tokens: torch.Tensor, anchor_pos: torch.Tensor, gamma: int, max_ngram: int,
                 min_ngram: int = 1) -> torch.Tensor:
    """tokens [B, T], anchor_pos [B, A] → hints [B, A, gamma] long, -1 where the lookup proposes nothing. Row
    (b, a) equals lookup(tokens[b, :p + 1], gamma, max_ngram, min_ngram) padded with -1 (p = anchor_pos[b, a]):
    only tokens at positions <= p (committed when the block is drafted) can be hints. (Training's many anchors a
    row; the one implementation is the lookup kernel's torch reference.)"""
    from synodic.kernels.ngram_lookup import lookup_hints_ref
    return lookup_hints_ref(tokens, anchor_pos, gamma, max_ngram, min_ngram)


def history_hints(history: torch.Tensor, rows: torch.Tensor, anchors: torch.Tensor, positions: torch.Tensor,
                  gamma: int, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """[B, gamma] hints (-1: none) for anchors [B] at positions [B] over the runner's token history (ModelRunner.
    track_history: row rows[i] holds the committed tokens before positions[i]); the anchor is written first,
    as the verify that follows would. Equal to lookup over the context up to and including the anchor: one
    kernel on a GPU (synodic.kernels.ngram_lookup)."""
    # (a position past the history, which no request within the graph's max_seq_len reaches, would read a
    # shorter context: a worse draft, never a wrong output or an out-of-range read)
    from synodic.kernels.ngram_lookup import ngram_hints
    return ngram_hints(history, rows, anchors, positions, gamma, max_ngram, min_ngram)


def host_hints(contexts: list[list[int]], gamma: int, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """[B, gamma] long hints of host token lists (the context up to and including the anchor), -1 padded."""
    rows = [lookup(c, gamma, max_ngram, min_ngram) for c in contexts]
    return torch.tensor([(r + [-1] * gamma)[:gamma] for r in rows], dtype=torch.long)
