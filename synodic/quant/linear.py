"""QuantLinear: a linear layer whose weight was solved by a quant method; plain torch, no kernels.

forward(x) = fake_quant(x * s, fmt) @ w_q.T + b   in activation-quant modes (W4A4, W8A8)
           =           (x * s)      @ w_q.T + b   in weight-only modes (W4A16, W8A16)
with (w_q, s) from `solve` (s = None for RTN). The multiply by s is done in fp32 right before the
activation quantizer, where a kernel would fuse it. The packed weight is kept beside the dequantized one
(`qtensor()`) for byte accounting and for kernels that read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synodic.quant.formats import FORMATS, get_format
from synodic.quant.methods import solve_full
from synodic.quant.qtensor import QTensor, fake_quant

MODES = {"w4a16": (4, False), "w8a16": (8, False), "w4a4": (4, True), "w8a8": (8, True)}
DEFAULT_FORMAT = {4: "mxfp4", 8: "mxfp8_e4m3"}


def _check(mode: str, fmt: str | None) -> tuple[str, bool]:
    if mode not in MODES:
        raise ValueError(f"unknown quant mode {mode!r}; expected one of: {', '.join(MODES)}")
    bits, act = MODES[mode]
    fmt = fmt or DEFAULT_FORMAT[bits]
    if get_format(fmt).elem.bits != bits:
        fits = [f for f, spec in FORMATS.items() if spec.elem.bits == bits]
        raise ValueError(
            f"quant mode {mode} needs a {bits}-bit format, got {fmt!r}; expected one of: {', '.join(fits)}"
        )
    return fmt, act


class QuantLinear(nn.Module):
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        mode: str = "w4a16",
        fmt: str | None = None,
        method: str = "rtn",
        rule: str = "floor",
        **method_opts,
    ):
        """`weight` (out x in) is solved with `method` (rtn | smoothquant | dualquant; options such as
        act_absmax=, alpha=, iters= pass through). `rule`: MX scale rule for weights and activations."""
        super().__init__()
        self.fmt, self.act_quant = _check(mode, fmt)
        self.mode, self.method, self.rule = mode, method, rule
        self.out_features, self.in_features = weight.shape
        sol = solve_full(weight, self.fmt, method, rule=rule, **method_opts)
        self.register_buffer("weight_q", sol.w_q.to(weight.dtype))
        self.register_buffer("act_scale", sol.s)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("qdata", sol.q.data)
        self.register_buffer("qscale", sol.q.scale)
        self.register_buffer("qtensor_scale", sol.q.tensor_scale)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kw) -> QuantLinear:
        return cls(linear.weight.detach(), linear.bias, **kw)

    def qtensor(self) -> QTensor:
        """The stored (packed) weight: Q(W / s)."""
        return QTensor(self.fmt, self.qdata, self.qscale, self.qtensor_scale, tuple(self.weight_q.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x if self.act_scale is None else x.float() * self.act_scale
        if self.act_quant:
            a = fake_quant(a, self.fmt, rule=self.rule)
        return F.linear(a.to(x.dtype), self.weight_q.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}, "
            f"fmt={self.fmt}, method={self.method}, bias={self.bias is not None}"
        )
