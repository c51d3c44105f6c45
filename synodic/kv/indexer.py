"""Training-free top-k indexer over resident low-precision key copies.

Per attention layer a paged device cache keeps a copy of every past key in bf16, or in fp8 (e4m3)
with one fp32 scale per (token, KV head) — the DSA "small key cache that stays on the GPU", here
filled from the model's own keys instead of a learned indexer head. The score of past position t
for a query is the sum over query heads of the dot product with t's (dequantised) key copy,

    score[t] = Σ_g (Σ_{r ∈ group g} q_r) · k̂[t, g] · scale[t, g],

and the selection is the top min(top_k, pos + 1) positions of [0, pos] by score, ties to the lower
position (a stable sort: the selection depends only on the scores, never on pool layout). Rows past
the selection are -1. Decode scores are elementwise products reduced over the head dim, so a row's
scores do not depend on which other rows share the batch.

A learned DSA-style indexer (its own q/k projections, Σ_j w_j ReLU(q_j · k)) would plug in by writing
its keys here instead of the model's and scoring with its own queries; no preset carries one yet.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
KEY_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


class KeyIndexer:
    def __init__(self, num_layers: int, num_pages: int, block_size: int, nkv: int, hd: int, kind: str, device):
        self.kind = kind
        self.bs = block_size
        dt = KEY_DTYPES[kind]
        # +1 page: the scratch page of padding rows and unallocated table entries.
        self.keys = [torch.zeros(num_pages + 1, block_size, nkv, hd, dtype=dt, device=device)
                     for _ in range(num_layers)]
        self.scales = ([torch.ones(num_pages + 1, block_size, nkv, dtype=torch.float32, device=device)
                        for _ in range(num_layers)] if kind == "fp8" else None)

    def row_bytes(self) -> int:
        """Bytes of one token's key copy in one layer."""
        k = self.keys[0]
        return k[0, 0].numel() * k.element_size() + (self.scales[0][0, 0].numel() * 4 if self.scales else 0)

    def device_bytes(self) -> int:
        return sum(k.numel() * k.element_size() for k in self.keys) + \
            (sum(s.numel() * 4 for s in self.scales) if self.scales else 0)

    def quantize(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.kind == "bf16":
            return k.to(torch.bfloat16), None
        scale = (k.float().abs().amax(-1) / FP8_MAX).clamp_min(1e-12)
        return (k.float() / scale[..., None]).to(torch.float8_e4m3fn), scale

    def dequantize(self, kq: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return kq.float() if scale is None else kq.float() * scale[..., None]

    def write(self, i: int, rows: torch.Tensor, k: torch.Tensor) -> None:
        """rows [M] flat rows (page * bs + offset) ← keys k [M, nkv, hd]."""
        kq, scale = self.quantize(k)
        page, off = rows // self.bs, rows % self.bs
        self.keys[i][page, off] = kq
        if scale is not None:
            self.scales[i][page, off] = scale

    @staticmethod
    def _qsum(q: torch.Tensor, nkv: int) -> torch.Tensor:
        N, nq, hd = q.shape
        return q.float().view(N, nkv, nq // nkv, hd).sum(2)        # [N, nkv, hd]

    def decode_scores(self, i: int, q: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
        """q [N, nq, hd], pages [N, view] (page ids of each row's index table) → scores [N, view * bs]."""
        keys = self.keys[i][pages].flatten(1, 2)                   # [N, T, nkv, hd]
        qs = self._qsum(q, keys.shape[2])
        if q.is_cuda:
            s = torch.einsum("ngd,ntgd->ntg", qs, keys.float())
        else:
            s = (qs[:, None] * keys.float()).sum(-1)               # [N, T, nkv]
        if self.scales is not None:
            s = s * self.scales[i][pages].flatten(1, 2)
        return s.sum(-1)

    @staticmethod
    def select(scores: torch.Tensor, pos: torch.Tensor, top_k: int) -> torch.Tensor:
        """Top min(top_k, pos+1) of positions [0, pos] per row, ties to the lower position; [N, top_k] int32."""
        N, T = scores.shape
        t = torch.arange(T, device=scores.device)
        s = scores.masked_fill(t[None, :] > pos[:, None], float("-inf"))
        order = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :top_k]
        if order.shape[1] < top_k:
            order = torch.cat([order, order.new_zeros(N, top_k - order.shape[1])], 1)
        rank = torch.arange(top_k, device=scores.device)
        return torch.where(rank[None, :] <= pos[:, None], order, -1).to(torch.int32)

    def prefill_select(self, q: torch.Tensor, k: torch.Tensor, top_k: int, chunk: int = 256) -> torch.Tensor:
        """Causal top-k of every prompt query over the prompt's own (quantised) keys: [T, top_k] int32."""
        T = q.shape[0]
        kq, scale = self.quantize(k)
        kd = self.dequantize(kq, scale)                            # [T, nkv, hd]
        qs = self._qsum(q, k.shape[1])
        out = []
        for c in range(0, T, chunk):
            s = torch.einsum("ngd,tgd->nt", qs[c:c + chunk], kd)
            out.append(self.select(s, torch.arange(c, min(T, c + chunk), device=q.device), top_k))
        return torch.cat(out)
