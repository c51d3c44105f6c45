"""Plain-torch reference of `mlp_act`: what the MLP's forward computes without the fused kernel."""
import torch
import torch.nn.functional as F


def mlp_act_ref(gate: torch.Tensor, up: torch.Tensor | None, act: str) -> torch.Tensor:
    if act == "silu":
        return F.silu(gate) * up
    return F.relu(gate).square()
