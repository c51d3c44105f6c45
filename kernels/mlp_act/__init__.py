"""The MLP activation of a decode step as one kernel (it was two elementwise launches, each a full pass over
the [tokens, intermediate] activations):

    act "silu":  y = silu(gate) * up        (SwiGLU, Qwen-style MLPs)
    act "relu2": y = relu(gate)²            (squared ReLU, NemotronH; `up` is None)

gate / up [..., D], the last dim contiguous (rows may be strided: halves of one projection's output work).
Triton: fp32 arithmetic, one rounding to the output dtype; the reference is the models' torch composition
(rounds after each op in low precision).
"""
from __future__ import annotations

import torch

from .._dispatch import expect_shape, pick_backend
from .ref import mlp_act_ref

__all__ = ["mlp_act", "mlp_act_ref", "ACTS"]

ACTS = ("silu", "relu2")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def mlp_act(gate: torch.Tensor, up: torch.Tensor | None = None, *, act: str, backend: str = "auto") -> torch.Tensor:
    """act(gate) (* up): see the module docstring. Returns gate's shape and dtype. No autograd."""
    if act not in ACTS:
        raise ValueError(f"act: expected one of {ACTS}, got {act!r}")
    if (act == "silu") != (up is not None):
        raise ValueError(f"up: act {act!r} {'needs' if act == 'silu' else 'takes no'} up tensor")
    if gate.dim() < 1 or gate.dtype not in _DTYPES:
        raise ValueError(f"gate: expected a float32 / bfloat16 / float16 tensor [..., D], got {gate.dtype} "
                         f"{tuple(gate.shape)}")
    if up is not None:
        expect_shape("up", up, tuple(gate.shape), "gate's shape")
        if up.dtype != gate.dtype or up.device != gate.device:
            raise ValueError(f"up: expected gate's dtype and device ({gate.dtype}, {gate.device}), "
                             f"got ({up.dtype}, {up.device})")
    if pick_backend(backend, gate) == "ref":
        return mlp_act_ref(gate, up, act)
    from .triton_impl import mlp_act_triton

    return mlp_act_triton(gate, up, act)
