"""Mamba-2 mixer (NemotronH layout): in_proj → [z, xBC, dt]; causal conv on xBC; SSD; D skip;
gated RMSNorm per group; out_proj. Decode goes through the run's SSM state backend."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import HybridConfig
from .norm import GatedRMSNorm
from .scan import causal_conv, mamba2_chunked


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: HybridConfig, ssm_index: int):
        super().__init__()
        self.ssm_index = ssm_index
        self.H, self.P, self.N, self.G = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups
        self.d_inner = self.H * self.P
        self.conv_dim = self.d_inner + 2 * self.G * self.N
        self.chunk = cfg.chunk_size
        self.in_proj = nn.Linear(cfg.hidden_size, self.d_inner + self.conv_dim + self.H, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim, bias=True)
        # dt initialised in [1e-3, 1e-1] as in Mamba-2; A in [1, 16].
        dt = torch.exp(torch.rand(self.H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.H).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.H))
        self.norm = GatedRMSNorm(self.d_inner, cfg.rms_norm_eps, group_size=self.d_inner // self.G)
        self.out_proj = nn.Linear(self.d_inner, cfg.hidden_size, bias=False)
        self._A = (None, None)  # (key, A) while A_log is unchanged: see `A`

    def A(self) -> torch.Tensor:
        """-exp(A_log) in fp32. Without autograd it is computed once per A_log version (three launches per layer
        and decode step otherwise); never cached inside a CUDA-graph capture, where kernels do not run."""
        p = self.A_log
        if torch.is_grad_enabled():
            return -torch.exp(p.float())
        key = (p.data_ptr(), p._version, p.dtype, p.device)
        if self._A[0] != key:
            if p.is_cuda and torch.cuda.is_current_stream_capturing():
                return -torch.exp(p.float())
            self._A = (key, -torch.exp(p.float()))
        return self._A[1]

    def _split(self, h):
        z, xBC, dt = torch.split(h, [self.d_inner, self.conv_dim, self.H], dim=-1)
        return z, xBC, dt

    def _xbc(self, xBC):
        x, B, C = torch.split(xBC, [self.d_inner, self.G * self.N, self.G * self.N], dim=-1)
        return (x.unflatten(-1, (self.H, self.P)), B.unflatten(-1, (self.G, self.N)),
                C.unflatten(-1, (self.G, self.N)))

    def forward(self, hidden: torch.Tensor, ctx=None) -> torch.Tensor:
        """hidden [b,T,d]. ctx None: whole sequences from zero state; ctx.mode 'prefill' (b=1) seeds
        the backend's slot; 'decode' (T=1) steps through the backend."""
        z, xBC, dt = self._split(self.in_proj(hidden))
        A = self.A()
        w = self.conv1d.weight[:, 0]
        if ctx is not None and ctx.mode == "decode":
            xBC = ctx.ssm.conv_step(self.ssm_index, xBC[:, 0], w, self.conv1d.bias)
            x, B, C = self._xbc(xBC)
            y = ctx.ssm.mamba2_step(self.ssm_index, x, dt[:, 0], A, B, C, self.D, self.dt_bias)
            y = y[:, None].flatten(-2)
        elif ctx is not None and ctx.mode == "verify":  # a window of T tokens per row, no state written
            xBC = ctx.ssm.conv_window(self.ssm_index, xBC, w, self.conv1d.bias)
            x, B, C = self._xbc(xBC)
            y = ctx.ssm.mamba2_verify(self.ssm_index, x, dt, A, B, C, self.D, self.dt_bias).flatten(-2)
        else:
            xBC, conv_state = causal_conv(xBC, w, self.conv1d.bias)
            x, B, C = self._xbc(xBC)
            dtp = F.softplus(dt.float() + self.dt_bias.float())
            y, state = mamba2_chunked(x, dtp, A, B, C, self.chunk)
            y = (y + x.float() * self.D.float()[:, None]).to(hidden.dtype).flatten(-2)
            if ctx is not None:
                for r, slot in enumerate(ctx.slots):
                    ctx.ssm.seed(self.ssm_index, slot, state[r], conv_state[r])
        return self.out_proj(self.norm(y, z))
