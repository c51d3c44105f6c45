"""MLPs: SwiGLU (Qwen-style) and squared-ReLU (NemotronH)."""
import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str):
        super().__init__()
        self.act = act
        if act == "silu":
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        if self.act == "silu":
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            h = F.relu(self.up_proj(x)).square()
        return self.down_proj(h)
