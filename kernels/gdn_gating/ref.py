"""Plain-torch reference of `gdn_gating`: the GDN layer's torch expressions before the fused kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gating_ref(a, b, A_log, dt_bias):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())
