"""Sparse MoE MLP (Qwen3-Next's block): a softmax router picks the top-k of E SwiGLU experts per token
(weights renormalised over the k when `norm_topk_prob`), plus a shared SwiGLU expert scaled by
sigmoid(shared_expert_gate(x)). Plain torch, grouped by expert:

- few (token, expert) pairs (decode, short verify windows), and any step being captured into a CUDA
  graph: each pair's expert weights are gathered and applied with one batched matmul — no host sync
  (a temporary of pairs x expert size: large batches of big experts want a fused kernel);
- many pairs (prefill): pairs are sorted by expert and each expert runs one GEMM over its tokens.

`hits` (a device buffer) counts, per expert, the pairs routed to it in the last forward: the ledger
counts the bytes of the experts actually read (`expert_bytes_read`)."""
import torch
import torch.nn.functional as F
from torch import nn

from .config import HybridConfig
from .mlp import MLP

GATHER_MAX_PAIRS = 64  # (token, expert) pairs up to which experts are gathered per pair rather than grouped


def route(logits: torch.Tensor, k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the softmax over experts (fp32), renormalised over the k when asked; weights in logits' dtype."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, idx = torch.topk(probs, k, dim=-1)
    if normalise:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.to(logits.dtype), idx


def experts_ref(x, idx, w, gate_up, down) -> torch.Tensor:
    """Reference: every token through its k experts one by one. x [N,D], idx / w [N,k], gate_up [E,2I,D],
    down [E,D,I] → [N,D]."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[n, j])
            g, u = (gate_up[e] @ x[n]).chunk(2)
            out[n] += w[n, j] * (down[e] @ (F.silu(g) * u))
    return out


def experts_grouped(x, idx, w, gate_up, down) -> torch.Tensor:
    """The same sum, grouped by expert (see the module docstring for the two paths)."""
    N, k = idx.shape
    flat = idx.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)  # pair p = (token p // k, its (p % k)-th expert)
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()  # no host sync inside a CUDA graph
    if N * k <= GATHER_MAX_PAIRS or capturing:
        g, u = torch.bmm(gate_up[flat], xs[:, :, None])[..., 0].chunk(2, dim=-1)
        y = torch.bmm(down[flat], (F.silu(g) * u)[:, :, None])[..., 0]
    else:
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
        y = torch.empty_like(xs)
        start = 0
        for e, c in enumerate(counts):
            if c:
                sel = order[start:start + c]
                g, u = (xs[sel] @ gate_up[e].T).chunk(2, dim=-1)
                y[sel] = (F.silu(g) * u) @ down[e].T
                start += c
    return (y * w.reshape(-1, 1)).view(N, k, -1).sum(dim=1)


class SparseMoE(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        E, D, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.top_k, self.normalise = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(D, E, bias=False)  # the router
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, D) * cfg.initializer_range)  # [gate; up] rows
        self.down_proj = nn.Parameter(torch.randn(E, D, I) * cfg.initializer_range)
        Is = cfg.shared_expert_intermediate_size
        self.shared_expert = MLP(D, Is, "silu") if Is else None
        self.shared_expert_gate = nn.Linear(D, 1, bias=False) if Is else None
        self.register_buffer("hits", torch.zeros(E, dtype=torch.long), persistent=False)

    def expert_bytes_read(self) -> int:
        """Bytes of the routed experts' weights the last forward read (each distinct expert once)."""
        per = (self.gate_up_proj[0].numel() + self.down_proj[0].numel()) * self.gate_up_proj.element_size()
        return int((self.hits > 0).sum()) * per

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        w, idx = route(self.gate(h), self.top_k, self.normalise)
        if not torch.is_grad_enabled():
            self.hits.zero_()
            self.hits.index_add_(0, idx.reshape(-1), torch.ones_like(idx.reshape(-1)))
        out = experts_grouped(h, idx, w, self.gate_up_proj, self.down_proj)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
        return out.view(x.shape)
