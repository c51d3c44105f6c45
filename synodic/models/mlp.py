"""MLPs: SwiGLU (Qwen-style) and squared-ReLU (NemotronH)."""
import torch
from torch import nn

from synodic.kernels.mlp_act import mlp_act

from .fuse import project
from .norm import fused_backend


class MLP(nn.Module):
    FUSED_PROJECTIONS = ("gate_proj", "up_proj")  # one GEMM once fused (synodic/models/fuse.py)

    def __init__(self, hidden: int, inter: int, act: str):
        super().__init__()
        self.act = act
        if act == "silu":
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        # the activation (and SwiGLU's product) as one kernel on CUDA: synodic.kernels.mlp_act
        if self.act == "silu":
            g, u = project(self, self.FUSED_PROJECTIONS, x)
            h = mlp_act(g, u, act="silu", backend=fused_backend(g, u))
        else:
            u = self.up_proj(x)
            h = mlp_act(u, act="relu2", backend=fused_backend(u))
        return self.down_proj(h)
