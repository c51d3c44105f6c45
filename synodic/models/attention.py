"""GQA attention with RoPE and optional QK-norm. Prefill uses SDPA over the prompt and hands K/V to
the KV policy; decode hands the new token's K/V to the policy, which stores and attends. A policy
with top-k sparse attention (it has `prefill_attend`) also runs the prefill attention, so every
query — prompt or decode — attends to its own top-k positions.

With `index_n_heads > 0` the layer carries a learned indexer (`self.indexer`, synodic/models/indexer.py);
when the KV policy scores with it (`learned_index`), the layer hands the policy the indexer's q_I, w and
k_I next to q/k/v (`index=`). Without a context (training, whole-sequence forward) it is not run."""
import torch
import torch.nn.functional as F
from torch import nn

from synodic.kernels.rope import rope_cs, rope_norm, rope_ref

from .config import HybridConfig
from .fuse import project
from .norm import RMSNorm, fused_backend


def step_rope(ctx, pos: torch.Tensor, theta: float, rot_dim: int):
    """rope_cs of a decode / verify step's positions, computed by the first layer and reused by the others
    (ctx.rope: the step's cache; None outside a step)."""
    cache = getattr(ctx, "rope", None)
    if cache is None:
        return None
    key = (theta, rot_dim)
    if key not in cache:
        cache[key] = rope_cs(pos, theta, rot_dim)
    return cache[key]


def window_positions(ctx, T: int) -> torch.Tensor:
    """[B, T] positions of a verify window, computed by the first attention layer and reused by the others (kept
    in the step's ctx.rope cache beside the cos / sin: two launches a layer otherwise)."""
    key = ("positions", T)
    if key not in ctx.rope:
        ctx.rope[key] = ctx.positions[:, None] + torch.arange(T, device=ctx.positions.device)
    return ctx.rope[key]


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float, rot_dim: int, cs=None) -> torch.Tensor:
    """Rotate-half RoPE on the first rot_dim dims. x [..., T, heads, D], pos broadcastable to [..., T];
    cs: rope_cs(pos, theta, rot_dim) when already computed."""
    cos, sin = rope_cs(pos, theta, rot_dim) if cs is None else cs
    return rope_ref(x, cos, sin, rot_dim)


class Attention(nn.Module):
    FUSED_PROJECTIONS = ("q_proj", "k_proj", "v_proj")  # one GEMM once fused (synodic/models/fuse.py)

    def __init__(self, cfg: HybridConfig, attn_index: int):
        super().__init__()
        self.attn_index = attn_index
        self.nq, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.rot = int(self.hd * cfg.partial_rotary_factor) // 2 * 2
        self.q_proj = nn.Linear(cfg.hidden_size, self.nq * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        # Qwen3-Next's gated attention: o * sigmoid(o_gate(x)) per channel before o_proj
        self.o_gate = nn.Linear(cfg.hidden_size, self.nq * self.hd, bias=False) if cfg.attn_output_gate else None
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.indexer = None
        if cfg.index_n_heads:
            from .indexer import LightningIndexer
            self.indexer = LightningIndexer(cfg)

    def _qkv(self, h, pos, ctx=None):
        q, k, v = project(self, self.FUSED_PROJECTIONS, h)
        q, k, v = (q.unflatten(-1, (self.nq, self.hd)), k.unflatten(-1, (self.nkv, self.hd)),
                   v.unflatten(-1, (self.nkv, self.hd)))
        if not self.rot:
            return (self.q_norm(q), self.k_norm(k), v) if self.qk_norm else (q, k, v)
        cos, sin = step_rope(ctx, pos, self.theta, self.rot) or rope_cs(pos, self.theta, self.rot)
        if self.qk_norm:
            return self._rope(q, cos, sin, self.q_norm), self._rope(k, cos, sin, self.k_norm), v
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def _rope(self, x, cos, sin, norm=None):
        """(QK-norm and) RoPE of one tensor: one kernel on CUDA (synodic.kernels.rope)."""
        if norm is None:
            return rope_norm(x, cos, sin, self.rot, backend=fused_backend(x))
        return rope_norm(x, cos, sin, self.rot, norm.weight, norm.eps, backend=fused_backend(x, norm.weight))

    def _out(self, o: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """o_proj of the heads' outputs o [b,T,nq,hd] (after the output gate, when the layer has one)."""
        o = o.flatten(-2)
        if self.o_gate is not None:
            o = o * torch.sigmoid(self.o_gate(hidden))
        return self.o_proj(o)

    def _index(self, h, pos, ctx):
        ix = self.indexer
        return ix(h, pos, step_rope(ctx, pos, ix.theta, ix.rot) if ix.rot else None)

    def forward(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        b, T, _ = hidden.shape
        learned = ctx is not None and ctx.kv.learned_index
        if ctx is not None and ctx.mode == "decode":
            pos = ctx.positions[:, None]
            q, k, v = self._qkv(hidden, pos, ctx)
            kw = {"index": self._index(hidden, pos, ctx).at(slice(None), 0)} if learned else {}
            o = ctx.kv.attend(self.attn_index, q[:, 0], k[:, 0], v[:, 0], **kw)[:, None]
        elif ctx is not None and ctx.mode == "verify":
            pos = window_positions(ctx, T)
            q, k, v = self._qkv(hidden, pos, ctx)
            kw = {"index": self._index(hidden, pos, ctx)} if learned else {}
            o = ctx.kv.attend_window(self.attn_index, q, k, v, **kw)
        else:
            start = 0 if ctx is None else ctx.start
            pos = torch.arange(start, start + T, device=hidden.device)
            q, k, v = self._qkv(hidden, pos)
            sparse = ctx.kv.prefill_attend if ctx is not None else None
            if sparse is not None:  # top-k KV policies: each prompt query attends to its own top-k
                kw = {"index": self.indexer(hidden, pos).at(0)} if learned else {}
                return self._out(sparse(self.attn_index, ctx.slot, start, q[0], k[0], v[0], **kw)[None], hidden)
            if ctx is not None:
                for r, slot in enumerate(ctx.slots):
                    ctx.kv.write_prefill(self.attn_index, slot, start, k[r], v[r])
            rep = self.nq // self.nkv
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2),
                v.repeat_interleave(rep, 2).transpose(1, 2), is_causal=True).transpose(1, 2)
        return self._out(o, hidden)
