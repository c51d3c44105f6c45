"""DualQuant: calibration-free dual scaling, min ||W - diag(a^-1) M diag(b^-1)||^2 (see docs/quantization.md).

We carry d = a^-1 (dequant scale per row per block) and s = b^-1 (per input column, the activation
multiplier of our contract), so W ~= d * M * s and the stored weight is Q(W / s). Block coordinate
descent, each step closed form and vectorised over all rows and blocks:
    M = Q(W/s given d);  d = <W, M s> / <M s, M s> per row-block, rounded to the scale format
    M = Q(W/s given d);  s = <W, M d> / <M d, M d> per column
Scale formats: E8M0 (MX) -> d is the MX cast's own scale, so the final codes are exactly a plain MX cast
of W/s (the per-row a is redundant for power-of-two scales); NVFP4 -> d = p * E4M3(d_ls / p) with the
per-tensor p = amax(W/s)/2688 re-derived after every s step; INT4-g64 -> d in fp32, unrounded.
The best iterate (weight MSE) is returned; the descent is not monotone once scales are rounded.
"""

from __future__ import annotations

import torch

from synodic.quant.elements import E2M1, E4M3
from synodic.quant.formats import FormatSpec, check_blocks, get_format
from synodic.quant.intq import int_encode_blocks
from synodic.quant.methods.common import Solution, check_weight
from synodic.quant.mx import e8m0_to_fp32, mx_scale_data
from synodic.quant.nvfp4 import (
    E4M3_TINY,
    nvfp4_block_scales,
    nvfp4_encode_blocks,
    nvfp4_scale_data,
    per_tensor_scale,
)
from synodic.quant.pack import pack_int4, pack_uint4
from synodic.quant.qtensor import QTensor, dequantize, quantize


def _ls(num: torch.Tensor, den: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """num/den where the fit is defined (some nonzero code), else keep the old scale."""
    return torch.where((den > 0) & (num > 0), num / torch.where(den > 0, den, 1.0), old)


class _MX:
    """E8M0 block scales: d is whatever the MX cast picks for W/s; nothing to refit."""

    refits = False

    def __init__(self, spec: FormatSpec, rule: str):
        self.spec, self.rule = spec, rule

    def reset(self, wh: torch.Tensor) -> None:
        self.wh = wh

    def project(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale, data = mx_scale_data(self.wh, self.spec.elem, self.spec.block, self.rule)
        return self.spec.elem.round(data), e8m0_to_fp32(scale)

    def refit(self, d_ls: torch.Tensor) -> None:
        pass

    def snapshot(self) -> dict:
        return {}

    def qtensor(self, w: torch.Tensor, s: torch.Tensor) -> QTensor:
        return quantize(w / s, self.spec, rule=self.rule)


class _NVFP4:
    """Two-level scale: per-tensor fp32 p from amax(W/s), E4M3 block scales relative to p."""

    refits = True

    def __init__(self, spec: FormatSpec):
        self.spec = spec

    def reset(self, wh: torch.Tensor) -> None:
        self.wh = wh.reshape(wh.shape[0], -1, self.spec.block)
        p = per_tensor_scale(wh.abs().amax())
        self.p = torch.where(p > 0, p, 1.0)
        if not hasattr(self, "scale"):  # first call: the plain NVFP4 cast's block scales
            self.scale = nvfp4_block_scales(self.wh, self.p)

    def _d(self) -> torch.Tensor:
        return (self.p * E4M3.decode(self.scale)).unsqueeze(-1)

    def project(self) -> tuple[torch.Tensor, torch.Tensor]:
        return E2M1.round(nvfp4_scale_data(self.wh, self.scale, self.p)), self._d()

    def refit(self, d_ls: torch.Tensor) -> None:
        self.scale = E4M3.encode(torch.clamp(d_ls.squeeze(-1) / self.p, E4M3_TINY, E4M3.max))

    def snapshot(self) -> dict:
        return {"scale": self.scale}

    def qtensor(self, w: torch.Tensor, s: torch.Tensor) -> QTensor:
        self.reset(w / s)
        codes = nvfp4_encode_blocks(self.wh, self.scale, self.p).reshape(w.shape)
        return QTensor(self.spec.name, pack_uint4(codes), self.scale.clone(), self.p, tuple(w.shape))


class _Int:
    """fp32 group scales, no rounding of d."""

    refits = True

    def __init__(self, spec: FormatSpec):
        self.spec = spec

    def reset(self, wh: torch.Tensor) -> None:
        self.wh = wh.reshape(wh.shape[0], -1, self.spec.block)
        if not hasattr(self, "d"):
            self.d = self.wh.abs().amax(-1, keepdim=True) / self.spec.elem.qmax

    def project(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.spec.elem.round(self.wh / torch.where(self.d == 0, 1.0, self.d)), self.d

    def refit(self, d_ls: torch.Tensor) -> None:
        self.d = d_ls

    def snapshot(self) -> dict:
        return {"d": self.d}

    def qtensor(self, w: torch.Tensor, s: torch.Tensor) -> QTensor:
        self.reset(w / s)
        codes = int_encode_blocks(self.wh, self.d, self.spec.elem).reshape(w.shape)
        return QTensor(self.spec.name, pack_int4(codes), self.d.squeeze(-1).clone(), None, tuple(w.shape))


def _init_s(w: torch.Tensor) -> torch.Tensor:
    """s = 1/b = ||W_:j||_1, normalised by a power of two to geometric mean ~1 (exact: every format
    here commutes with power-of-two scaling, so this only keeps activations x*s in a sane range)."""
    s = w.abs().sum(0)
    s = torch.where(s > 0, s, 1.0)
    return s * torch.exp2(-torch.round(torch.log2(s).mean()))


def solve_dualquant(weight: torch.Tensor, fmt: str, *, iters: int = 15, rule: str = "floor") -> Solution:
    """`iters`: coordinate-descent rounds (default 15); `rule`: MX scale rule (MX formats only)."""
    w = check_weight(weight)
    spec = get_format(fmt)
    check_blocks(tuple(w.shape), spec)
    if iters < 0:
        raise ValueError(f"dualquant iters must be >= 0, got {iters}")
    state = {"mx": lambda: _MX(spec, rule), "nvfp4": lambda: _NVFP4(spec), "int": lambda: _Int(spec)}[spec.family]()
    n, k, b = *w.shape, spec.block
    wb = w.reshape(n, k // b, b)

    s = _init_s(w)
    state.reset(w / s)
    best: tuple = (float("inf"), s, {}, -1)
    history = []
    for t in range(iters + 1):  # round `iters` only evaluates the last s
        sb = s.reshape(k // b, b)
        m, d = state.project()
        if state.refits:
            ms = m * sb
            state.refit(_ls((wb * ms).sum(-1, keepdim=True), (ms * ms).sum(-1, keepdim=True), d))
            m, d = state.project()
        md = m * d
        history.append(((wb - md * sb) ** 2).mean().item())
        if history[-1] < best[0]:
            best = (history[-1], s, state.snapshot(), t)
        if t == iters:
            break
        s = _ls((wb * md).sum(0), (md * md).sum(0), sb).reshape(k)
        state.reset(w / s)

    mse, s, snap, t_best = best
    state.__dict__.update(snap)  # back to the best iterate's block scales
    q = state.qtensor(w, s)
    return Solution(dequantize(q), s, q, {"mse": mse, "mse_history": history, "best_iter": t_best})
