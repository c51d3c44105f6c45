"""Top-k indexers over a resident low-precision key cache: training-free (`KeyIndexer`) and learned
(`LearnedIndexer`).

Per attention layer a paged device cache keeps a copy of every past key in bf16, or in fp8 (e4m3)
with one fp32 scale per (token, KV head) — the DSA "small key cache that stays on the GPU", here
filled from the model's own keys instead of a learned indexer head. The score of past position t
for a query is the sum over query heads of the dot product with t's (dequantised) key copy,

    score[t] = Σ_g (Σ_{r ∈ group g} q_r) · k̂[t, g] · scale[t, g],

and the selection is the top min(top_k, pos + 1) positions of [0, pos] by score, ties to the lower
position (a stable sort: the selection depends only on the scores, never on pool layout). Rows past
the selection are -1. Decode scores are elementwise products reduced over the head dim, so a row's
scores do not depend on which other rows share the batch.

A learned DSA-style indexer (synodic/models/indexer.py: its own projections per attention layer) plugs
in through `LearnedIndexer`: the same paged cache holds the indexer's one key k_I per token ([d_I],
bf16, or fp8 with one fp32 scale per token) instead of the model's keys, and the score of t is

    score[t] = scale[t] · Σ_j w_j · ReLU(q_I,j · k̂_I[t])          (= Σ_j w_j ReLU(q_I,j · k_I[t]), scale > 0)

with the current token's q_I [H_I, d_I] and w [H_I] in fp32. Selection is the same `select`. Decode and
prefill scores are the same function on the same quantised keys (on the CPU: elementwise products
reduced over d_I, then over the heads; on CUDA: the fused `synodic.kernels.index_scores` kernel, which
reads the paged keys in place and whose per-key bits do not depend on the launch), so a prompt's prefill
selection equals what decoding the same prompt teacher-forced selects.
"""
from __future__ import annotations

import torch

from synodic.kernels.index_scores import index_scores
from synodic.kernels.key_write import quantize_fp8_ref, write_keys_fp8
from synodic.kernels.topk_select import topk_select

KEY_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


class KeyIndexer:
    learned = False

    def __init__(self, num_layers: int, num_pages: int, block_size: int, nkv: int, hd: int, kind: str, device):
        self._alloc(num_layers, num_pages, block_size, (nkv, hd), kind, device)

    def _alloc(self, num_layers: int, num_pages: int, block_size: int, row: tuple[int, ...], kind: str, device):
        """Per layer keys [num_pages + 1, block_size, *row] (+ fp32 scales [.., *row[:-1]] for fp8)."""
        self.kind = kind
        self.bs = block_size
        dt = KEY_DTYPES[kind]
        # +1 page: the scratch page of padding rows and unallocated table entries.
        self.keys = [torch.zeros(num_pages + 1, block_size, *row, dtype=dt, device=device)
                     for _ in range(num_layers)]
        self.scales = ([torch.ones(num_pages + 1, block_size, *row[:-1], dtype=torch.float32, device=device)
                        for _ in range(num_layers)] if kind == "fp8" else None)

    def row_bytes(self) -> int:
        """Bytes of one token's cached index key (+ its scale) in one layer."""
        k = self.keys[0]
        return k[0, 0].numel() * k.element_size() + (self.scales[0][0, 0].numel() * 4 if self.scales else 0)

    def device_bytes(self) -> int:
        return sum(k.numel() * k.element_size() for k in self.keys) + \
            (sum(s.numel() * 4 for s in self.scales) if self.scales else 0)

    def quantize(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.kind == "bf16":
            return k.to(torch.bfloat16), None
        return quantize_fp8_ref(k)

    def dequantize(self, kq: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return kq.float() if scale is None else kq.float() * scale[..., None]

    def write(self, i: int, rows: torch.Tensor, k: torch.Tensor) -> None:
        """rows [M] flat rows (page * bs + offset) ← keys k [M, nkv, hd] (learned: k_I [M, d_I])."""
        self.write_at(i, rows // self.bs, rows % self.bs, k)

    def write_at(self, i: int, page: torch.Tensor, off: torch.Tensor, k: torch.Tensor) -> None:
        """Keys k [M, ...] into (page [M], offset [M]) of layer i's cache."""
        if self.kind == "fp8" and self.keys[i].dim() == 3:  # one scale per key row: one launch on CUDA
            write_keys_fp8(self.keys[i], self.scales[i], page, off, k.reshape(-1, k.shape[-1]))
            return
        kq, scale = self.quantize(k)
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
        """Top min(top_k, pos+1) of positions [0, pos] per row, ties to the lower position; [N, top_k] int32.
        `synodic.kernels.topk_select`: Triton on CUDA (each row split over many programs for up to 8 rows or rows
        past 32768 scores, one program per row otherwise), the stable-sort reference elsewhere; both give the
        same ids in the same order."""
        return topk_select(scores, pos, top_k)

    def prefill_select(self, q: torch.Tensor, k: torch.Tensor, top_k: int, chunk: int = 256,
                       start: int = 0) -> torch.Tensor:
        """Causal top-k of prompt queries start..T-1 over the prompt's own (quantised) keys: [T - start, top_k]
        int32. A chunk of queries scores (and sorts) only the keys it can see, positions < the chunk's end."""
        T = q.shape[0]
        kq, scale = self.quantize(k)
        kd = self.dequantize(kq, scale)                            # [T, nkv, hd]
        qs = self._qsum(q, k.shape[1])
        out = [torch.empty(0, top_k, dtype=torch.int32, device=q.device)]
        for c in range(start, T, chunk):
            e = min(T, c + chunk)
            s = torch.einsum("ngd,tgd->nt", qs[c:e], kd[:e])
            out.append(self.select(s, torch.arange(c, e, device=q.device), top_k))
        return torch.cat(out)


class LearnedIndexer(KeyIndexer):
    """Cache and scores of a learned DSA indexer: keys k_I [M, d_I] in, queries (q_I [N, H_I, d_I], w [N, H_I]).
    `kind` is the cached keys' dtype (bf16, or fp8 e4m3 with one fp32 scale per token)."""
    learned = True
    CPU_ELEMS = 1 << 24            # CPU: query rows x keys x H_I x d_I products per scoring call (64 MB fp32)
    CUDA_ELEMS = 1 << 27           # CUDA: query rows x keys x H_I dot products per einsum (512 MB fp32)

    def __init__(self, num_layers: int, num_pages: int, block_size: int, n_heads: int, head_dim: int, kind: str,
                 device):
        self.n_heads, self.head_dim = n_heads, head_dim
        self._alloc(num_layers, num_pages, block_size, (head_dim,), kind, device)

    @staticmethod
    def scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor | None,
               einsum: bool | None = None) -> torch.Tensor:
        """q [N, H, d], w [N, H], cached keys [N or 1, T, d] (+ scale [N or 1, T]) → scores [N, T] (fp32).
        Decode and prefill both call this, so equal inputs give equal bits. einsum (default: on CUDA)
        computes the dots as a (batched) matmul, in row blocks that bound the [N, H, T] intermediate."""
        if q.is_cuda if einsum is None else einsum:
            N, T, H = q.shape[0], keys.shape[1], q.shape[1]
            step = max(1, LearnedIndexer.CUDA_ELEMS // (T * H))
            if N > step:
                return torch.cat([LearnedIndexer.scores(
                    q[c:c + step], w[c:c + step], keys if keys.shape[0] == 1 else keys[c:c + step],
                    scale if scale is None or scale.shape[0] == 1 else scale[c:c + step], einsum)
                    for c in range(0, N, step)])
            if keys.shape[0] == 1:  # one key set for every row (prefill): one GEMM, the keys never copied per row
                dots = (q.float().reshape(N * H, -1) @ keys[0].float().T).view(N, H, T)
            else:
                dots = torch.bmm(q.float(), keys.float().transpose(1, 2))    # [N, H, T]
            s = (dots.relu() * w.float()[:, :, None]).sum(1)
        else:
            dots = (q.float()[:, None] * keys.float()[:, :, None]).sum(-1)   # [N, T, H]: rows never mix
            s = (dots.relu() * w.float()[:, None]).sum(-1)
        return s if scale is None else s * scale

    def decode_scores(self, i: int, query, pages: torch.Tensor) -> torch.Tensor:
        """query (q_I [N, H, d], w [N, H]), pages [N, view] → scores [N, view * bs]. On CUDA one fused kernel
        (synodic.kernels.index_scores) reads the paged keys in place."""
        q, w = query
        if q.is_cuda:
            return index_scores(q, w, self.keys[i], None if self.scales is None else self.scales[i], pages)
        keys = self.keys[i][pages].flatten(1, 2)                   # [N, T, d]
        scale = self.scales[i][pages].flatten(1, 2) if self.scales is not None else None
        return self.scores(q, w, keys, scale)

    def prefill_select(self, query, k: torch.Tensor, top_k: int, chunk: int = 256, start: int = 0) -> torch.Tensor:
        """Causal top-k of prompt queries start..T-1 (q_I [T, H, d], w [T, H]) over the prompt's quantised k_I
        [T, d]: [T - start, top_k] int32. A chunk of queries scores only the keys before the chunk's end."""
        q, w = query
        T = q.shape[0]
        kq, scale = self.quantize(k)
        keys, scale1 = kq[None], (scale[None] if scale is not None else None)
        # CUDA: the fused kernel (the decode path's, so equal bits) holds only the [chunk, T] scores
        per_row = T if q.is_cuda else T * self.n_heads * self.head_dim
        chunk = max(1, min(chunk, (self.CUDA_ELEMS if q.is_cuda else self.CPU_ELEMS) // max(1, per_row)))
        out = [torch.empty(0, top_k, dtype=torch.int32, device=q.device)]
        for c in range(start, T, chunk):
            e = min(T, c + chunk)
            if q.is_cuda:
                s = index_scores(q[c:e], w[c:e], kq[:e], None if scale is None else scale[:e])
            else:
                s = self.scores(q[c:e], w[c:e], keys[:, :e], None if scale1 is None else scale1[:, :e])
            out.append(self.select(s, torch.arange(c, e, device=q.device), top_k))
        return torch.cat(out)


def has_learned_indexer(model) -> bool:
    """Whether every attention layer of the model carries a learned indexer (synodic/models/indexer.py)."""
    layers = model.attention_layers
    return bool(layers) and all(getattr(m, "indexer", None) is not None for m in layers)


def index_kind(cfg, model) -> str:
    """The indexer a top-k policy builds: 'learned', 'bf16' or 'fp8' (`auto` resolved; `learned` checked)."""
    learned = has_learned_indexer(model)
    if cfg.indexer == "learned" and not learned:
        from synodic.config.errors import ConfigError
        raise ConfigError(["kv.indexer='learned': the model's attention layers carry no learned indexer "
                           "(index_n_heads=0); expected kv.indexer=auto, bf16 or fp8 (training-free), or a "
                           "model with one (index_n_heads > 0, e.g. model=tiny_dsa)"])
    if cfg.indexer == "auto":
        return "learned" if learned else "bf16"
    return cfg.indexer
