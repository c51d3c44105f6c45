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
  * dense=False: only the packed weight is resident (the format's bytes). The packed kernel takes up to
    PACKED_ONLY_MAX_ROWS[fmt] rows; more rows (prefill, large batches) and CPU dequantize the weight for the call
    (`synodic.kernels.quant_dequant`: one read of the codes, one write of the dense weight) and run the dense
    matmul, so a call holds one layer's dense weight transiently.
`backend="triton"` forces the kernel for any row count; "torch" never uses it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synodic.kernels.row_scale import row_scale
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
PACKED_ONLY_MAX_ROWS = {"mxfp4": 128, "nvfp4": 128, "mxfp8_e4m3": 128, "mxfp8_e5m2": 128}
# rows per call (inclusive range, per format) that 'auto' sends to the plane-layout GEMM ("kgemm",
# synodic.kernels.quant_linear.kgemm) on CUDA with bf16 activations, ahead of the rules above. Empty: no
# layer routes to it until a GPU run (`python -m benchmarks.quant_gemm --kgemm`) shows where it beats both the bf16
# linear and the stored-layout kernels. A layer of a listed format keeps the weight a second time in the plane
# layout (built once, with the layer: `kmajor()`).
KGEMM_ROWS: dict[str, tuple[int, int]] = {}


def dense_copy_pays(fmt: str, device_type: str, dtype: torch.dtype, backend: str, rows: int) -> tuple[bool, str]:
    """quant.dense_copy=auto: whether a model whose decode calls take at most `rows` rows needs the dequantized copy,
    and why. Not where every such call runs the packed kernel with or without the copy (CUDA, backend auto, a kernel
    format, rows within KERNEL_MAX_ROWS): decode is then the same and the copy only costs memory (prefill takes the
    copy-less path: the packed kernel up to PACKED_ONLY_MAX_ROWS, a per-call dequantization above). Everywhere else
    the copy is what the layer's calls read."""
    from synodic.kernels.quant_linear import KERNEL_FORMATS
    if device_type != "cuda":
        return True, f"on {device_type} every call reads the dense weight"
    if backend != "auto" or fmt not in KERNEL_FORMATS:
        return True, (f"backend={backend}" if backend != "auto" else f"no packed kernel for {fmt}") + \
            ": calls read the dense weight"
    limit = KERNEL_MAX_ROWS[fmt] if dtype in (torch.bfloat16, torch.float16) else KERNEL_MAX_ROWS_FP32
    if rows <= limit:
        return False, f"decode calls of up to {rows} rows all run the packed kernel (it takes up to {limit})"
    return True, f"decode calls of up to {rows} rows, above the {limit} the packed kernel takes, read it"


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


def _on_gpu(x: torch.Tensor) -> bool:
    return x.is_cuda


def scale_rows(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x * s (s per input channel, fp32) in x's dtype, the fp32 product rounded once: the bits of
    (x.float() * s).to(x.dtype), which takes three kernels (at 256 rows, 112 linears, ~2 ms of a step). On the GPU
    `row_scale`'s one vectorised pass (torch's mixed-dtype multiply runs at about a third of the copy rate)."""
    if torch.is_grad_enabled() and (x.requires_grad or s.requires_grad):  # out= has no autograd
        return (x.float() * s).to(x.dtype)
    if _on_gpu(x) and s.dtype == torch.float32:
        return row_scale(x, s)
    return torch.mul(x, s, out=torch.empty_like(x))


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
        self._kmajor = None  # the plane layout, built once where KGEMM_ROWS routes this format (kmajor())
        if self.fmt in KGEMM_ROWS:
            self.kmajor()

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

    def kmajor(self):
        """The weight in kgemm's plane layout (kernels/quant_linear/kmajor.py), built on first use and kept as
        non-persistent buffers (checkpoints hold the stored layout only), so it follows the module across devices."""
        from synodic.kernels.quant_linear import KMajorWeight, pack_kmajor
        if self._kmajor is None or self.kmajor_words.device != self.qdata.device:
            k = pack_kmajor(self.qtensor())
            self.register_buffer("kmajor_words", k.words, persistent=False)
            self.register_buffer("kmajor_factors", k.factors, persistent=False)
            self._kmajor = (k.K, k.KP, k.block)
        K, KP, block = self._kmajor
        return KMajorWeight(self.fmt, self.kmajor_words, self.kmajor_factors, self.qtensor_scale, self.out_features, K,
                            KP, block)

    def uses_kgemm(self, x: torch.Tensor) -> bool:
        """Whether forward(x) runs the plane-layout GEMM: backend 'auto', CUDA, bf16 (its fast path; fp16 / fp32
        run an fp32 dot there), rows in KGEMM_ROWS."""
        rng = KGEMM_ROWS.get(self.fmt)
        if rng is None or self.backend != "auto" or not x.is_cuda or x.dtype != torch.bfloat16:
            return False
        return rng[0] <= x.numel() // self.in_features <= rng[1]

    def dense_bytes(self) -> int:
        """Bytes of the dequantized weight: the kept copy, or the layer's dtype without one."""
        if self.weight_q is not None:
            return self.weight_q.numel() * self.weight_q.element_size()
        return self.out_features * self.in_features * torch.empty(0, dtype=self.dtype).element_size()

    def resident_bytes(self) -> int:
        """Bytes this layer's weights occupy: packed codes + scales (+ s), the dense copy when kept, and the plane
        layout where KGEMM_ROWS routes the format."""
        kb = self.kmajor().nbytes() if self.fmt in KGEMM_ROWS else 0
        return self.packed_bytes() + (self.dense_bytes() if self.dense else 0) + kb

    def weight_bytes(self, rows: int = 1) -> int:
        """Bytes a decode step over `rows` rows reads for this weight: through the packed kernel, codes
        + block scales (+ NVFP4's tensor scale); on the dense path, the kept dequantized weight, or without
        one the codes read + the dense weight written and read back; plus the per-input-channel activation
        multiplier s when there is one."""
        probe = torch.empty(rows, self.in_features, device=self.qdata.device, dtype=torch.bfloat16)
        if self.uses_kgemm(probe):
            s = 0 if self.act_scale is None else self.act_scale.numel() * 4
            return self.kmajor().nbytes() + s
        if self.uses_kernel(probe):
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
        """Whether forward(x) runs the packed Triton kernel: backend 'triton' always (CUDA, or CPU under
        TRITON_INTERPRET=1), 'auto' on CUDA for a kernel format and up to KERNEL_MAX_ROWS[fmt] rows (one for fp32
        activations), 'torch' never."""
        if self.backend == "torch" or (self.backend == "auto" and not x.is_cuda):
            return False
        from synodic.kernels.quant_linear import KERNEL_FORMATS
        ok = self.fmt in KERNEL_FORMATS
        if self.backend == "triton":
            if not ok:
                raise ValueError(f"backend='triton': the packed kernel reads {', '.join(KERNEL_FORMATS)}, "
                                 f"not {self.fmt}")
            return True
        if not ok:
            return False
        if x.dtype in (torch.bfloat16, torch.float16):
            rows = (KERNEL_MAX_ROWS if self.dense else PACKED_ONLY_MAX_ROWS)[self.fmt]
        else:
            rows = KERNEL_MAX_ROWS_FP32
        return x.numel() // self.in_features <= rows

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_kgemm(x):
            return self._kernel_forward(x, self.kmajor())
        if self.uses_kernel(x):
            return self._kernel_forward(x)
        if self.act_quant:
            a = fake_quant(x if self.act_scale is None else x.float() * self.act_scale, self.fmt, rule=self.rule)
        else:
            a = x if self.act_scale is None else scale_rows(x, self.act_scale)
        return F.linear(a.to(x.dtype), self.dense_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def _kernel_forward(self, x: torch.Tensor, q=None) -> torch.Tensor:
        """The packed kernel on the stored layout, or on q (the plane layout: kgemm)."""
        from synodic.kernels.quant_linear import quant_linear
        bias = None if self.bias is None else self.bias.to(x.dtype)
        q, s = q if q is not None else self.qtensor(), self.act_scale
        if not self.act_quant:
            return quant_linear(x, q, s, bias, backend="triton")
        if self.fmt == "mxfp4" and self.rule == "floor":  # x * s and the MXFP4 quantizer fused (kgemm: in torch)
            return quant_linear(x, q, s, bias, act_quant="mxfp4", backend="triton")
        a = x if s is None else x.float() * s
        return quant_linear(fake_quant(a, self.fmt, rule=self.rule).to(x.dtype), q, None, bias, backend="triton")

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}, "
            f"fmt={self.fmt}, method={self.method}, bias={self.bias is not None}, dense={self.dense}"
        )
