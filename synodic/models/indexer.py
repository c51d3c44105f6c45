"""Learned top-k indexer of an attention layer (DeepSeek-V3.2 DSA "lightning indexer" shape).

Per attention layer, from the layer's input h (the normed residual stream, the same input q/k/v see):

    q_I[j] = rope(W_q h)[j]                 j = 1..H_I index heads, d_I dims each   (indexer.wq)
    k_I    = rope(LayerNorm(W_k h))          one key per token, shared by the heads  (indexer.wk, indexer.k_norm)
    w[j]   = (W_w h)[j] · (H_I · d_I)^-1/2   per-head weights                        (indexer.weights_proj)

    score[t] = Σ_j w[j] · ReLU(q_I[j] · k_I[t])

and attention attends to the top-k positions by score. The KV policy caches k_I (paged, on the device,
fp8 e4m3 with a per-token scale or bf16: synodic/kv/indexer.py `LearnedIndexer`) and scores every past
position with the current token's q_I and w; this module only produces the three projections.

Choices, and why:
- RoPE on the leading `index_rope_dim` dims of q_I and k_I (rotate-half, the attention layer's
  rope_theta), the rest position-free — DSA rotates 64 of 128 dims; a learned indexer without
  positions cannot prefer recent tokens. `index_rope_dim=0` turns it off.
- k_I goes through a LayerNorm (as in DSA) so its per-token fp8 scale sees a bounded range.
- The constant (H_I · d_I)^-1/2 on w is DSA's head count and softmax scaling folded into one factor;
  a positive constant never changes a top-k, it keeps scores of order one.
- q_I is a full-rank projection of h (DSA projects MLA's low-rank query latent; this model has none),
  and there is no Hadamard rotation before the fp8 cast (a per-token scale already covers it).
- The index scores are computed in fp32 from the projections (the cached keys are the low-precision part).

Training the indexer (DSA: KL to the dense attention distribution, then sparse training) is not done
here; random-weight presets select with random projections, which is enough for the systems path.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from synodic.kernels.rope import rope_cs, rope_norm

from .config import HybridConfig
from .fuse import project
from .norm import fused_backend


class IndexerOut(NamedTuple):
    """q [..., H_I, d_I], w [..., H_I], k [..., d_I] over the same leading dims (batch, tokens)."""
    q: torch.Tensor
    w: torch.Tensor
    k: torch.Tensor

    def at(self, *idx) -> IndexerOut:
        """The same leading-dim index applied to q, w and k (e.g. `.at(slice(None), 0)`: token 0 of each row)."""
        return IndexerOut(self.q[idx], self.w[idx], self.k[idx])


class LightningIndexer(nn.Module):
    FUSED_PROJECTIONS = ("wq", "wk", "weights_proj")  # one GEMM once fused (synodic/models/fuse.py)

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.rot, self.theta = cfg.index_rope_dim, cfg.rope_theta
        self.w_scale = (self.n_heads * self.head_dim) ** -0.5
        self.wq = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def forward(self, h: torch.Tensor, pos: torch.Tensor, cs=None) -> IndexerOut:
        """h [..., T, hidden], pos broadcastable to [..., T] → IndexerOut over [..., T]; cs: rope_cs of pos
        when already computed (a decode step shares it across layers)."""
        q, k, w = project(self, self.FUSED_PROJECTIONS, h)
        q = q.unflatten(-1, (self.n_heads, self.head_dim))
        k = self.k_norm(k)
        w = w * self.w_scale
        if self.rot:  # one kernel per tensor on CUDA (synodic.kernels.rope), as the attention layer's q / k
            cos, sin = rope_cs(pos, self.theta, self.rot) if cs is None else cs
            q = rope_norm(q, cos, sin, self.rot, backend=fused_backend(q))
            k = rope_norm(k[..., None, :], cos, sin, self.rot, backend=fused_backend(k))[..., 0, :]
        return IndexerOut(q, w, k)

    @staticmethod
    def scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Full-precision reference: q [N, H_I, d_I], w [N, H_I], keys k [T, d_I] → scores [N, T]."""
        return torch.einsum("nh,nth->nt", w.float(), torch.einsum("nhd,td->nth", q.float(), k.float()).relu())
