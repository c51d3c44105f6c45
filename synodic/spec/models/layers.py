"""The drafter's decoder layer: attention whose keys are the target-context rows (projected by the layer's own
k/v) followed by the block's own rows, queries from the block only; SwiGLU MLP; DFlash2's dynamic convolution."""
import torch
import torch.nn.functional as F
from torch import nn

from synodic.kernels.dynamic_conv import dynamic_conv, tap_inside
from synodic.kernels.rope_dtype import rope_dtype

from .config import DraftConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


_INV_FREQ: dict[tuple, torch.Tensor] = {}  # (dim, theta, device) -> inverse frequencies: constants, built once


def rope_cos_sin(pos: torch.Tensor, dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., dim/2] of absolute positions pos [...] (computed in fp32). The inverse frequencies are
    cached per (dim, theta, device): four launches a call otherwise, twice a speculative step."""
    key = (dim, float(theta), pos.device)
    inv = _INV_FREQ.get(key)
    if inv is None:
        with torch.inference_mode(False):  # a normal tensor, usable by a later training forward too
            inv = theta ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim)
        if not (pos.is_cuda and torch.cuda.is_current_stream_capturing()):  # (a capture's tensors are its pool's)
            _INV_FREQ[key] = inv
    ang = pos.to(torch.float32)[..., None] * inv
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, heads, d]; cos/sin [B, N, d/2] (rotate-half convention). Without autograd one fused kernel
    (synodic.kernels.rope_dtype, rounded as these ops round)."""
    if not torch.is_grad_enabled() and cos.dtype == x.dtype:
        return rope_dtype(x, cos, sin)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, :, None], sin[:, :, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class DraftAttention(nn.Module):
    """GQA attention with QK-norm and full RoPE at absolute positions, so a context row's rotated key can be
    cached once in the ring and stays valid for every later block."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(H, self.nh * d, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values [B, N, nkv, d] of rows x [B, N, H] (context rows or the block's own)."""
        B, N, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, N, self.nkv, self.d)), cos, sin)
        return k, self.v_proj(x).view(B, N, self.nkv, self.d)

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """h [B, N, H] block rows; ctx_k/ctx_v [B, M, nkv, d]; mask [B, N, M + N] bool (True = attend)."""
        B, N, _ = h.shape
        q = apply_rope(self.q_norm(self.q_proj(h).view(B, N, self.nh, self.d)), cos, sin)
        k, v = self.kv(h, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=1), torch.cat([ctx_v, v], dim=1)
        rep = self.nh // self.nkv
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None])
        return self.o_proj(o.transpose(1, 2).reshape(B, N, self.nh * self.d))


class DynamicConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution over a block, as a residual:
    out[t, c] = x[t, c] + sum_j (base[c, j] + dyn[t, c // G, j]) * x[t - j, c], dyn = proj(x[t]) (one scalar per
    group of G channels per tap), x[t - j] = 0 before the start of t's block."""

    def __init__(self, hidden: int, group: int, taps: int):
        super().__init__()
        if hidden % group:
            raise ValueError(f"conv_group={group}: must divide hidden_size={hidden}")
        self.group, self.taps = group, taps
        self.base = nn.Parameter(torch.zeros(hidden, taps))
        self.proj = nn.Linear(hidden, (hidden // group) * taps, bias=False)

    def forward(self, x: torch.Tensor, first: torch.Tensor, inside: list[torch.Tensor] | None = None,
                start: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, N, H]; first [B, N] bool marks each block's first row (blocks are contiguous runs of rows);
        inside / start: tap_masks(first, taps) / block_starts(first), when the caller shares them across its
        convolutions. Without autograd one fused kernel (synodic.kernels.dynamic_conv) after the proj GEMM."""
        B, N, H = x.shape
        if not torch.is_grad_enabled() and self.base.dtype == x.dtype:
            start = block_starts(first) if start is None else start
            return dynamic_conv(x, self.proj(x), self.base, start, self.group, inside=inside)
        dyn = self.proj(x).view(B, N, H // self.group, self.taps).repeat_interleave(self.group, dim=2)
        kern = dyn + self.base
        if inside is None:
            inside = tap_masks(first, self.taps)
        out = x + kern[..., 0] * x  # tap 0: x[t] itself, always inside t's block (no shift, no mask)
        for j in range(1, self.taps):
            shifted = F.pad(x, (0, 0, j, 0))[:, :N]
            out = out + kern[..., j] * shifted * inside[j]
        return out


def block_starts(first: torch.Tensor) -> torch.Tensor:
    """[B, N] long: the first row of each row's block (first [B, N] marks block starts)."""
    idx = torch.arange(first.shape[1], device=first.device)
    return torch.cummax(torch.where(first, idx, 0), dim=1).values


def tap_masks(first: torch.Tensor, taps: int, start: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per tap j, [B, N, 1] bool: row t's input x[t - j] lies in t's block (first [B, N] marks block starts).
    The same for every convolution of a forward, so the drafter computes them once (8 convolutions a forward)."""
    return tap_inside(block_starts(first) if start is None else start, taps)  # (tap 0's is all True: unused)


class DraftLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP; with `conv`, a dynamic conv before each sublayer (on the residual stream)
    and one after it (on the sublayer's output)."""

    def __init__(self, cfg: DraftConfig, conv: bool):
        super().__init__()
        H = cfg.hidden_size
        self.attn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.attn = DraftAttention(cfg)
        self.mlp_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)
        self.convs = nn.ModuleList(DynamicConv(H, cfg.conv_group, cfg.conv_taps) for _ in range(4)) if conv else None

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask, first, inside=None, start=None) -> torch.Tensor:
        """inside / start: the convolutions' tap_masks(first, taps) / block_starts(first), shared by the caller's
        layers (computed here if None)."""
        c = self.convs
        if c is not None:
            start = block_starts(first) if start is None else start
            if inside is None and torch.is_grad_enabled():  # (the fused kernel reads start only)
                inside = tap_masks(first, c[0].taps, start)
            x = c[0](x, first, inside, start)
        a = self.attn(self.attn_norm(x), cos, sin, ctx_k, ctx_v, mask)
        x = x + (c[1](a, first, inside, start) if c is not None else a)
        if c is not None:
            x = c[2](x, first, inside, start)
        h = self.mlp_norm(x)
        m = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return x + (c[3](m, first, inside, start) if c is not None else m)
