"""Sparse MoE MLPs: a router picks the top-k of E experts per token, plus shared expert(s). Two variants,
as transformers implements them:

- Qwen3-Next: softmax router (weights renormalised over the k when `norm_topk_prob`), SwiGLU experts
  (`gate_up_proj` [E, 2I, D]), one shared SwiGLU expert scaled by sigmoid(shared_expert_gate(x));
- NemotronH (Nemotron-3 Nano): sigmoid router in fp32 whose choice adds a score-correction bias and is
  limited to the best `topk_group` of `n_group` expert groups (a group's score: the sum of its best two),
  weights = the chosen sigmoid scores (renormalised when asked) times `routed_scaling_factor`;
  non-gated squared-ReLU experts (`up_proj` [E, I, D]), optionally in a latent width (fc1 / fc2 latent
  projections around the routed experts); one ungated shared expert on the block's input.

Plain torch, grouped by expert:
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
ACTS = ("silu", "relu2")  # silu: gated SwiGLU experts ([gate; up] rows); relu2: non-gated relu(x)^2 experts


def route(logits: torch.Tensor, k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the softmax over experts (fp32), renormalised over the k when asked; weights in logits' dtype."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, idx = torch.topk(probs, k, dim=-1)
    if normalise:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.to(logits.dtype), idx


def route_sigmoid(logits: torch.Tensor, k: int, bias: torch.Tensor, n_group: int = 1, topk_group: int = 1,
                  normalise: bool = True, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k over sigmoid scores (fp32): experts are chosen by score + bias among the best
    `topk_group` groups (group score: sum of its two best), weighted by their plain scores (renormalised
    over the k when asked, + 1e-20 as transformers does) times `scale`. Weights fp32, indices [N, k]."""
    scores = torch.sigmoid(logits.float())
    choice = scores + bias.float()
    if n_group > 1:
        N, E = choice.shape
        grouped = choice.view(N, n_group, E // n_group)
        best = torch.topk(grouped.topk(2, dim=-1)[0].sum(-1), topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros(N, n_group, dtype=torch.bool, device=choice.device).scatter_(1, best, True)
        choice = choice.masked_fill(~keep.unsqueeze(-1).expand_as(grouped).reshape(N, E), float("-inf"))
    idx = torch.topk(choice, k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if normalise:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, idx


def expert_act(h: torch.Tensor, act: str) -> torch.Tensor:
    """The expert's hidden activation: silu(gate) * up of [gate | up], or relu(up)^2."""
    if act == "silu":
        g, u = h.chunk(2, dim=-1)
        return F.silu(g) * u
    return torch.square(F.relu(h))


def experts_ref(x, idx, w, w_in, down, act: str = "silu") -> torch.Tensor:
    """Reference: every token through its k experts one by one. x [N,D], idx / w [N,k], w_in [E,2I,D]
    (silu: [gate; up]) or [E,I,D] (relu2), down [E,D,I] → [N,D] in x's dtype (sums in w's dtype)."""
    out = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, w.dtype))
    for n in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[n, j])
            out[n] += w[n, j] * (down[e] @ expert_act(w_in[e] @ x[n], act))
    return out.to(x.dtype)


def experts_grouped(x, idx, w, w_in, down, act: str = "silu") -> torch.Tensor:
    """The same sum, grouped by expert (see the module docstring for the two paths)."""
    N, k = idx.shape
    flat = idx.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)  # pair p = (token p // k, its (p % k)-th expert)
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()  # no host sync inside a CUDA graph
    if N * k <= GATHER_MAX_PAIRS or capturing:
        h = expert_act(torch.bmm(w_in[flat], xs[:, :, None])[..., 0], act)
        y = torch.bmm(down[flat], h[:, :, None])[..., 0]
    else:
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=w_in.shape[0]).tolist()
        y = torch.empty_like(xs)
        start = 0
        for e, c in enumerate(counts):
            if c:
                sel = order[start:start + c]
                y[sel] = expert_act(xs[sel] @ w_in[e].T, act) @ down[e].T
                start += c
    # fp32 router weights (NemotronH) sum in fp32, as transformers does, then cast back
    return (y * w.reshape(-1, 1)).view(N, k, -1).sum(dim=1).to(x.dtype)


class SigmoidRouter(nn.Module):
    """NemotronH's router: weight [E, D] and e_score_correction_bias [E], both kept in fp32 whatever the
    model dtype (transformers keeps them there too: the bias decides close choices)."""

    def __init__(self, hidden: int, num_experts: int, k: int, n_group: int, topk_group: int, normalise: bool,
                 scale: float):
        super().__init__()
        self.k, self.n_group, self.topk_group, self.normalise, self.scale = k, n_group, topk_group, normalise, scale
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32),
                                                    requires_grad=False)

    def weight_bytes(self, rows: int = 1) -> int:
        return self.weight.numel() * self.weight.element_size()

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route_sigmoid(F.linear(h.float(), self.weight.float()), self.k, self.e_score_correction_bias,
                             self.n_group, self.topk_group, self.normalise, self.scale)


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int, inter: int, *, act: str = "silu",
                 router: str = "softmax", normalise: bool = True, n_group: int = 1, topk_group: int = 1,
                 scale: float = 1.0, shared_inter: int = 0, shared_gate: bool = True, latent: int = 0,
                 init_std: float = 0.02):
        super().__init__()
        if act not in ACTS or router not in ("softmax", "sigmoid"):
            raise ValueError(f"act={act!r}, router={router!r}: expected act in {ACTS} and router softmax or sigmoid")
        E, D, I = num_experts, hidden, inter
        Dx = latent or D  # the routed experts' input / output width
        self.act, self.top_k, self.normalise = act, top_k, normalise
        if router == "softmax":
            self.gate = nn.Linear(D, E, bias=False)
        else:
            self.gate = SigmoidRouter(D, E, top_k, n_group, topk_group, normalise, scale)
        self.fc1_latent_proj = nn.Linear(D, latent, bias=False) if latent else None
        self.fc2_latent_proj = nn.Linear(latent, D, bias=False) if latent else None
        w_in = nn.Parameter(torch.randn(E, (2 if act == "silu" else 1) * I, Dx) * init_std)
        if act == "silu":
            self.gate_up_proj = w_in  # [gate; up] rows
        else:
            self.up_proj = w_in
        self.down_proj = nn.Parameter(torch.randn(E, Dx, I) * init_std)
        self.shared_expert = MLP(D, shared_inter, act) if shared_inter else None
        self.shared_expert_gate = nn.Linear(D, 1, bias=False) if shared_inter and shared_gate else None
        self.register_buffer("hits", torch.zeros(E, dtype=torch.long), persistent=False)

    @classmethod
    def from_config(cls, cfg: HybridConfig) -> "SparseMoE":
        return cls(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                   act=cfg.mlp_hidden_act, router=cfg.moe_router, normalise=cfg.norm_topk_prob, n_group=cfg.n_group,
                   topk_group=cfg.topk_group, scale=cfg.routed_scaling_factor,
                   shared_inter=cfg.shared_expert_intermediate_size, shared_gate=cfg.shared_expert_gate,
                   latent=cfg.moe_latent_size, init_std=cfg.initializer_range)

    @property
    def w_in(self) -> torch.Tensor:
        return self.gate_up_proj if self.act == "silu" else self.up_proj

    def expert_bytes_read(self) -> int:
        """Bytes of the routed experts' weights the last forward read (each distinct expert once)."""
        per = (self.w_in[0].numel() + self.down_proj[0].numel()) * self.down_proj.element_size()
        return int((self.hits > 0).sum()) * per

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        if isinstance(self.gate, SigmoidRouter):
            w, idx = self.gate(h)
        else:
            w, idx = route(self.gate(h), self.top_k, self.normalise)
        if not torch.is_grad_enabled():
            self.hits.zero_()
            self.hits.index_add_(0, idx.reshape(-1), torch.ones_like(idx.reshape(-1)))
        z = h if self.fc1_latent_proj is None else self.fc1_latent_proj(h)
        out = experts_grouped(z, idx, w, self.w_in, self.down_proj, self.act)
        if self.fc2_latent_proj is not None:
            out = self.fc2_latent_proj(out)
        if self.shared_expert is not None:
            s = self.shared_expert(h)
            out = out + (s if self.shared_expert_gate is None else torch.sigmoid(self.shared_expert_gate(h)) * s)
        return out.view(x.shape)
