"""Triton helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def _round_bf16(v):
    # fp32 -> fp32 holding the round-to-nearest-even bf16 value. Used only under TRITON_INTERPRET,
    # whose fp32 -> bf16 cast truncates (the GPU cast rounds to nearest even).
    bits = v.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _softplus(v):
    # log1p(exp(v)) with an accurate log1p (Goldberg); identity above 20 like torch's softplus.
    u = tl.exp(v)
    w = 1.0 + u
    lp = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    return tl.where(v > 20.0, v, lp)
