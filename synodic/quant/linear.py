"""QuantLinear: a linear layer whose weight was solved by a quant method (torch path, or the packed kernel).

forward(x) = fake_quant(x * s, fmt) @ w_q.T + b   in activation-quant modes (W4A4, W8A8)
           =           (x * s)      @ w_q.T + b   in weight-only modes (W4A16, W8A16)
with (w_q, s) from `solve` (s = None for RTN). The multiply by s is done in fp32 right before the
activation quantizer, where a kernel would fuse it. The packed weight (`qtensor()`) is always kept: for byte
accounting (`weight_bytes()`) and for the packed decode kernel (`synodic.kernels.quant_linear`).

Two residencies (`dense`):
  * dense=True (default): the dequantized weight is kept beside the packed one (resident bytes: both). The
    packed kernel (`backend="auto"`, CUDA, MXFP4 / NVFP4 / MXFP8) takes inputs of up to KERNEL_MAX_ROWS[fmt]
    rows (where it beats the bf16 linear; one row for fp32 activations); more rows run the dense matmul on the
    kept copy.
  * dense=False: no dense copy. Formats the packed GEMM reads (GEMM_FORMATS) also keep the weight repacked once
    for it (`synodic.kernels.quant_linear.repack`: the same bytes permuted, plus K padding): one row runs the
    packed GEMV on the stored layout, GEMM_MIN_ROWS..GEMM_MAX_ROWS (2-256) rows the GEMM on the repacked one; other
    formats take the packed kernel up to PACKED_ONLY_MAX_ROWS[fmt] rows. More rows (prefill, large batches) and
    CPU dequantize the weight for the call (`synodic.kernels.quant_dequant`: one read of the codes, one write of
    the dense weight) and run the dense matmul, so a call holds one layer's dense weight transiently.
`backend="triton"` forces the kernel for any row count; "torch" never uses it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synodic.quant.formats import FORMATS, get_format
from synodic.quant.methods import solve_full
from synodic.quant.qtensor import QTensor, dequantize, fake_quant

MODES = {"w4a16": (4, False), "w8a16": (8, False), "w4a4": (4, True), "w8a8": (8, True),
         "w6a16": (6, False), "w6a6": (6, True)}
DEFAULT_FORMAT = {4: "mxfp4", 6: "mxfp6_e2m3", 8: "mxfp8_e4m3"}
BACKENDS = ("auto", "torch", "triton")
# rows per call that 'auto' sends to the packed kernel, per format: where it beats the bf16 linear (MXFP8 loses
# above 16 rows, every format at 64); fp32 activations: one row (the fp32 GEMV). docs/tuning/quant_linear.md
KERNEL_MAX_ROWS = {"mxfp4": 32, "nvfp4": 32, "mxfp8_e4m3": 16, "mxfp8_e5m2": 16}
KERNEL_MAX_ROWS_FP32 = 1
# the same without a dense copy: above these the weight is dequantized for the call and the bf16 matmul runs
# (where dequant + matmul beats the packed kernel: docs/tuning/quant_linear.md)
PACKED_ONLY_MAX_ROWS = {"mxfp4": 64, "nvfp4": 64, "mxfp8_e4m3": 128, "mxfp8_e5m2": 128}
# rows the packed GEMM over the repacked weight takes in a layer without a dense copy (one row stays on the GEMV)
GEMM_MIN_ROWS, GEMM_MAX_ROWS = 2, 256


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


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown QuantLinear backend {backend!r}; expected one of: {', '.join(BACKENDS)}")
    return backend


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
        backend: str = "auto",
        dense: bool = True,
        **method_opts,
    ):
        """`weight` (out x in) is solved with `method` (rtn | smoothquant | dualquant; options such as
        act_absmax=, alpha=, iters= pass through). `rule`: MX scale rule for weights and activations.
        `backend`: auto (packed kernel on CUDA where it applies, else torch) | torch | triton.
        `dense`: keep the dequantized weight resident (see the module docstring)."""
        super().__init__()
        self.fmt, self.act_quant = _check(mode, fmt)
        self.mode, self.method, self.rule = mode, method, rule
        self.backend = _check_backend(backend)
        sol = solve_full(weight, self.fmt, method, rule=rule, **method_opts)
        self.info = sol.info
        self._set(sol.q, sol.s, bias, weight.dtype, sol.w_q, dense)

    def _set(self, q: QTensor, s, bias, dtype, w_q=None, dense: bool = True) -> None:
        self.out_features, self.in_features = q.shape
        self.dtype, self.dense = dtype, bool(dense)
        self.register_buffer("weight_q", (dequantize(q) if w_q is None else w_q).to(dtype) if dense else None)
        self.register_buffer("act_scale", s)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("qdata", q.data)
        self.register_buffer("qscale", q.scale)
        self.register_buffer("qtensor_scale", q.tensor_scale)
        from synodic.kernels.quant_linear.repack import GEMM_FORMATS, repack
        g = repack(q) if not self.dense and q.fmt in GEMM_FORMATS else None
        self._gemm_kp = None if g is None else g.KP
        self.register_buffer("gemm_data", None if g is None else g.data)
        self.register_buffer("gemm_scale", None if g is None else g.scale)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kw) -> QuantLinear:
        return cls(linear.weight.detach(), linear.bias, **kw)

    @classmethod
    def from_packed(cls, q: QTensor, s: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                    mode: str = "w4a16", method: str = "rtn", rule: str = "floor", dtype: torch.dtype = torch.float32,
                    backend: str = "auto", dense: bool = True) -> QuantLinear:
        """A layer from an already solved weight (a stored checkpoint): no solving."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.fmt, self.act_quant = _check(mode, q.fmt)
        self.mode, self.method, self.rule, self.info = mode, method, rule, {}
        self.backend = _check_backend(backend)
        self._set(q, s, bias, dtype, dense=dense)
        return self

    def dense_bytes(self) -> int:
        """Bytes of the dequantized weight: the kept copy, or the layer's dtype without one."""
        if self.weight_q is not None:
            return self.weight_q.numel() * self.weight_q.element_size()
        return self.out_features * self.in_features * torch.empty(0, dtype=self.dtype).element_size()

    def resident_bytes(self) -> int:
        """Bytes this layer's weights occupy: packed codes + scales (+ s), the dense copy when kept, the GEMM's
        repacked copy when there is one."""
        return self.packed_bytes() + (self.dense_bytes() if self.dense else 0) + self.gemm_bytes()

    def gemm_bytes(self) -> int:
        """Bytes of the GEMM's repacked weight (codes + scales; 0 without one)."""
        if self.gemm_data is None:
            return 0
        return self.gemm_data.numel() + self.gemm_scale.numel()

    def weight_bytes(self, rows: int = 1) -> int:
        """Bytes a decode step over `rows` rows reads for this weight: through the packed kernel, codes
        + block scales (+ NVFP4's tensor scale); on the dense path, the kept dequantized weight, or without
        one the codes read + the dense weight written and read back; plus the per-input-channel activation
        multiplier s when there is one."""
        probe = torch.empty(rows, self.in_features, device=self.qdata.device, dtype=torch.bfloat16)
        path = self.kernel_path(probe)
        if path == "gemm":
            s = 0 if self.act_scale is None else self.act_scale.numel() * 4
            return self.gemm_bytes() + s + (0 if self.qtensor_scale is None else 4)
        if path == "packed":
            return self.packed_bytes()
        if not self.dense:
            return self.packed_bytes() + 2 * self.dense_bytes()
        s = 0 if self.act_scale is None else self.act_scale.numel() * 4
        return self.dense_bytes() + s

    def packed_bytes(self) -> int:
        """Stored size: packed codes + scales (+ s)."""
        s = 0 if self.act_scale is None else self.act_scale.numel() * 4
        return self.qtensor().nbytes() + s

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """Whether forward(x) runs a packed Triton kernel (see kernel_path)."""
        return self.kernel_path(x) is not None

    def kernel_path(self, x: torch.Tensor) -> str | None:
        """Which packed kernel forward(x) runs: "gemm" (the packed GEMM on the repacked weight), "packed" (the
        kernels on the stored layout) or None (the dense matmul). backend 'triton': always a kernel (CUDA, or CPU
        under TRITON_INTERPRET=1), the GEMM from GEMM_MIN_ROWS rows when the layer has its weight; 'auto' on CUDA
        for a kernel format: with a dense copy up to KERNEL_MAX_ROWS[fmt] rows (one for fp32 activations) the
        stored-layout kernels; without one, one row those, GEMM_MIN_ROWS..GEMM_MAX_ROWS (bf16 / fp16) the GEMM
        (formats without it: up to PACKED_ONLY_MAX_ROWS[fmt]); 'torch' never."""
        if self.backend == "torch" or (self.backend == "auto" and not x.is_cuda):
            return None
        from synodic.kernels.quant_linear import KERNEL_FORMATS
        ok = self.fmt in KERNEL_FORMATS
        rows = x.numel() // self.in_features
        gemm = self.gemm_data is not None and rows >= GEMM_MIN_ROWS
        if self.backend == "triton":
            if not ok:
                raise ValueError(f"backend='triton': the packed kernel reads {', '.join(KERNEL_FORMATS)}, "
                                 f"not {self.fmt}")
            return "gemm" if gemm else "packed"
        if not ok:
            return None
        if x.dtype not in (torch.bfloat16, torch.float16):
            return "packed" if rows <= KERNEL_MAX_ROWS_FP32 else None
        if gemm:
            return "gemm" if rows <= GEMM_MAX_ROWS else None
        return "packed" if rows <= (KERNEL_MAX_ROWS if self.dense else PACKED_ONLY_MAX_ROWS)[self.fmt] else None

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized weight in dtype: the kept copy, or (dense=False) decoded for this call — by the Triton
        dequant kernel on CUDA for its formats, the torch decode otherwise."""
        if self.weight_q is not None:
            return self.weight_q.to(dtype)
        from synodic.kernels.quant_dequant import dequant
        return dequant(self.qtensor(), dtype)

    def qtensor(self) -> QTensor:
        """The stored (packed) weight: Q(W / s)."""
        return QTensor(self.fmt, self.qdata, self.qscale, self.qtensor_scale, (self.out_features, self.in_features))

    def gemm_weight(self):
        """The GEMM's repacked weight (repack.GemmWeight), or None (a dense copy is kept, or no GEMM format)."""
        if self.gemm_data is None:
            return None
        from synodic.kernels.quant_linear.repack import GemmWeight
        return GemmWeight(self.fmt, self.gemm_data, self.gemm_scale, self.qtensor_scale, self.out_features,
                          self.in_features, self._gemm_kp, get_format(self.fmt).block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = self.kernel_path(x)
        if path is not None:
            return self._kernel_forward(x, path == "gemm")
        a = x if self.act_scale is None else x.float() * self.act_scale
        if self.act_quant:
            a = fake_quant(a, self.fmt, rule=self.rule)
        return F.linear(a.to(x.dtype), self.dense_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def _kernel_forward(self, x: torch.Tensor, gemm: bool = False) -> torch.Tensor:
        from synodic.kernels.quant_linear import quant_linear
        bias = None if self.bias is None else self.bias.to(x.dtype)
        q, s = self.gemm_weight() if gemm else self.qtensor(), self.act_scale
        if gemm and self.act_quant:  # the GEMM is weight-only: activations quantized in torch first
            a = x if s is None else x.float() * s
            return quant_linear(fake_quant(a, self.fmt, rule=self.rule).to(x.dtype), q, None, bias, backend="triton")
        if not self.act_quant:
            return quant_linear(x, q, s, bias, backend="triton")
        if self.fmt == "mxfp4" and self.rule == "floor":  # x * s and the MXFP4 quantizer fused in-kernel
            return quant_linear(x, q, s, bias, act_quant="mxfp4", backend="triton")
        a = x if s is None else x.float() * s
        return quant_linear(fake_quant(a, self.fmt, rule=self.rule).to(x.dtype), q, None, bias, backend="triton")

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}, "
            f"fmt={self.fmt}, method={self.method}, bias={self.bias is not None}, dense={self.dense}"
        )
