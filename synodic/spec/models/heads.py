"""Scheme heads on top of the backbone: DSpark's Markov and confidence heads, DFlash2's top-K path selector, and
the sampler they share (exact q: each draft is drawn from the distribution returned for it)."""
import torch
import torch.nn.functional as F
from torch import nn


def sample(logits: torch.Tensor, temperature: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, ..., C] → (tokens [B, ...], q [B, ..., C] fp32). Rows with temperature 0 take the argmax and
    get the one-hot q; others sample softmax(logits / T) by an exponential race (argmax q / E, E ~ Exp(1)),
    which needs no host sync."""
    t = temperature.to(torch.float32).view(-1, *([1] * (logits.dim() - 1)))
    greedy = t <= 0
    q = torch.softmax(logits.float() / torch.where(greedy, torch.ones_like(t), t), dim=-1)
    race = torch.empty_like(q).exponential_(generator=generator)
    tok = torch.where(greedy[..., 0], logits.argmax(-1), (q / race).argmax(-1))
    q = torch.where(greedy, F.one_hot(tok, q.shape[-1]).to(q.dtype), q)
    return tok, q


class MarkovHead(nn.Module):
    """p_k(v) = softmax(U_k(v) + (W1[x_{k-1}] W2)(v)): a rank-r bigram correction of the backbone's logits."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.W1 = nn.Embedding(vocab, rank)
        self.W2 = nn.Linear(rank, vocab, bias=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        return self.W2(self.W1(prev))


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w^T [h_k ; W1[x_{k-1}]] + b) ≈ P(draft k accepted | 1..k-1 accepted); a per-position
    temperature (fit after training) calibrates it."""

    def __init__(self, hidden: int, rank: int, gamma: int):
        super().__init__()
        self.w = nn.Linear(hidden + rank, 1)
        self.register_buffer("temperature", torch.ones(gamma))

    def logit(self, h: torch.Tensor, prev_emb: torch.Tensor) -> torch.Tensor:
        return self.w(torch.cat([h, prev_emb.to(h.dtype)], dim=-1))[..., 0]


class PathSelector(nn.Module):
    """S_t(a, b) = U_t(b) + <A(a) * H(h_t), B(b)>, a the token chosen at t-1, b one of the top-K of U_t."""

    def __init__(self, vocab: int, hidden: int, rank: int, k: int):
        super().__init__()
        self.k = k
        self.A = nn.Embedding(vocab, rank)
        self.B = nn.Embedding(vocab, rank)
        self.H = nn.Linear(hidden, rank, bias=False)

    def full_scores(self, prev: torch.Tensor, h: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        """S over the whole vocabulary [..., V] (training)."""
        return U + ((self.A(prev) * self.H(h)) @ self.B.weight.t()).float()

    def scores(self, prev: torch.Tensor, h: torch.Tensor, U: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """S over candidates cand [B, K] from prev [B], h [B, H], U [B, V] → [B, K]."""
        return self.path_table(prev, h[:, None], U.gather(1, cand)[:, None], cand[:, None])[:, 0, 0]

    def path_table(self, anchors: torch.Tensor, h: torch.Tensor, u_cand: torch.Tensor, cand: torch.Tensor
                   ) -> torch.Tensor:
        """Every score a block's left-to-right walk can ask for, in one batched pass: anchors [B], block rows h
        [B, g, H], the candidates cand [B, g, K] and U at them u_cand → S [B, g, K, K] fp32 with S[b, t, i, j] =
        S_t(a, cand[b, t, j]) for a = cand[b, t - 1, i] (t = 0: the anchor, in every i). The walk's previous
        token is always one of position t - 1's candidates, so a step of the walk is a lookup in this table
        instead of a handful of small kernels (a decode step's drafter is launch-bound at small batch)."""
        B, g, K = cand.shape
        prev = torch.cat([anchors[:, None, None].expand(B, 1, K), cand[:, :-1]], 1)  # [B, g, K]
        left = self.A(prev) * self.H(h)[:, :, None, :]                               # [B, g, K, r]
        return u_cand[:, :, None, :] + (left @ self.B(cand).transpose(-1, -2)).float()
