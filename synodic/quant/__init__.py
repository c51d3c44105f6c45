"""Quantization: block formats (MX, NVFP4, INT4-g64), methods (RTN, SmoothQuant, DualQuant).

    fake_quant(x, fmt)                 -> x quantized and dequantized (blocks along the last dim)
    quantize(x, fmt) / dequantize(q)   -> packed storage (QTensor) and back
    solve(weight, fmt, method, **opts) -> (w_q, s): fake_quant(x * s, fmt) @ w_q.T ~= x @ weight.T,
                                          effective weight w_q * s, stored weight Q(weight / s)

Formats: mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8_e4m3, mxfp8_e5m2, mxint8, nvfp4, int4_g64.
Methods: rtn, smoothquant (act_absmax=, alpha=0.5), dualquant (iters=15). MX options: rule=floor|rceil.
QuantLinear(weight, bias, mode=w4a16|w8a16|w4a4|w8a8, fmt=..., method=...): fake-quant linear layer.

Names resolve lazily (PEP 562) so that `synodic.quant.config`, imported when configs are validated,
does not pull in torch.
"""

from importlib import import_module

_WHERE = {
    "FORMATS": "formats",
    "FormatSpec": "formats",
    "get_format": "formats",
    "QTensor": "qtensor",
    "quantize": "qtensor",
    "dequantize": "qtensor",
    "fake_quant": "qtensor",
    "METHODS": "methods",
    "Solution": "methods",
    "solve": "methods",
    "solve_full": "methods",
    "MODES": "linear",
    "QuantLinear": "linear",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'synodic.quant' has no attribute {name!r}")
    return getattr(import_module(f"synodic.quant.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
