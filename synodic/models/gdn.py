"""Gated DeltaNet mixer (Qwen3-Next layout): in_proj_qkvz / in_proj_ba; causal conv on q,k,v;
L2-normalised q, k; α = exp(g), g = −exp(A_log)·softplus(a + dt_bias); β = sigmoid(b); delta rule;
gated RMSNorm per head; out_proj. Decode goes through the run's SSM state backend."""
import torch
from torch import nn

from synodic.kernels.gdn_gating import gdn_gating

from .config import HybridConfig
from .fuse import project
from .norm import GatedRMSNorm, fused_backend
from .scan import causal_conv, gdn_chunked


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNetMixer(nn.Module):
    FUSED_PROJECTIONS = ("in_proj_qkvz", "in_proj_ba")  # one GEMM once fused (synodic/models/fuse.py)

    def __init__(self, cfg: HybridConfig, ssm_index: int):
        super().__init__()
        self.ssm_index = ssm_index
        self.HV, self.Hk = cfg.linear_num_value_heads, cfg.linear_num_key_heads
        self.K, self.V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.Hk * self.K, self.HV * self.V
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.chunk = cfg.chunk_size
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, self.conv_dim + self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * self.HV, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim,
                                groups=self.conv_dim, bias=True)
        self.dt_bias = nn.Parameter(torch.ones(self.HV))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.HV).uniform_(1, 16)))
        self.norm = GatedRMSNorm(self.value_dim, cfg.rms_norm_eps, group_size=self.V,
                                 norm_before_gate=cfg.gdn_norm_before_gate)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)

    def _qkv(self, qkv):
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (q.unflatten(-1, (self.Hk, self.K)), k.unflatten(-1, (self.Hk, self.K)),
                v.unflatten(-1, (self.HV, self.V)))

    def forward(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        qkvz, ba = project(self, self.FUSED_PROJECTIONS, hidden)
        qkv, z = torch.split(qkvz, [self.conv_dim, self.value_dim], dim=-1)
        b, a = ba.chunk(2, dim=-1)
        # g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), fp32: one fused kernel
        g, beta = gdn_gating(a, b, self.A_log, self.dt_bias, backend=fused_backend(a, self.A_log, self.dt_bias))
        w = self.conv1d.weight[:, 0]
        if ctx is not None and ctx.mode == "decode":
            qkv = ctx.ssm.conv_step(self.ssm_index, qkv[:, 0], w, self.conv1d.bias)
            q, k, v = self._qkv(qkv)
            o = ctx.ssm.gdn_step(self.ssm_index, q, k, v, g[:, 0], beta[:, 0])[:, None]
        elif ctx is not None and ctx.mode == "verify":
            qkv = ctx.ssm.conv_window(self.ssm_index, qkv, w, self.conv1d.bias)
            q, k, v = self._qkv(qkv)
            o = ctx.ssm.gdn_verify(self.ssm_index, q, k, v, g, beta)
        else:
            qkv, conv_state = causal_conv(qkv, w, self.conv1d.bias)
            q, k, v = self._qkv(qkv)
            rep = self.HV // self.Hk
            qn = (l2norm(q) * self.K ** -0.5).repeat_interleave(rep, dim=2)
            kn = l2norm(k).repeat_interleave(rep, dim=2)
            o, state = gdn_chunked(qn, kn, v, g, beta, self.chunk)
            if ctx is not None:
                for r, slot in enumerate(ctx.slots):
                    ctx.ssm.seed(self.ssm_index, slot, state[r], conv_state[r])
        o = o.to(hidden.dtype).flatten(-2)
        return self.out_proj(self.norm(o, z))
