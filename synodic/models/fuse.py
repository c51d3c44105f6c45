"""One GEMM for the projections that read the same input (GDN in_proj_qkvz + in_proj_ba, SwiGLU gate + up,
attention q / k / v): at decode batch sizes a small projection's launch costs several µs on its own, and one wider
GEMM fills the GPU better than two or three narrow ones.

The fused weight is one storage whose row blocks the modules' own weight parameters view, so parameter names,
state_dict and in-place loads (`copy_`) are unchanged. Anything that replaces one of the modules or its weight
(quantization swapping in a QuantLinear, `.to()`, a new Parameter) sends that owner back to separate GEMMs, as
does autograd (the fused weight is not a parameter)."""
import torch
import torch.nn.functional as F
from torch import nn


class FusedProjection:
    def __init__(self, mods: list[nn.Linear]):
        self.mods = mods
        self.weight = torch.cat([m.weight.detach() for m in mods])
        self.sizes = [m.out_features for m in mods]
        start = 0
        for m, n in zip(mods, self.sizes):
            m.weight = nn.Parameter(self.weight[start:start + n], requires_grad=m.weight.requires_grad)
            start += n
        self.ptrs = [m.weight.data_ptr() for m in mods]

    def holds(self, mods: list[nn.Module]) -> bool:
        return all(a is b for a, b in zip(mods, self.mods)) and all(
            m.weight.data_ptr() == p for m, p in zip(mods, self.ptrs))


def _fusable(mods) -> bool:
    return (all(type(m) is nn.Linear and m.bias is None and not m._forward_hooks and not m._forward_pre_hooks
                for m in mods)
            and len({(m.in_features, m.weight.dtype, m.weight.device) for m in mods}) == 1)


def fuse_projections(model: nn.Module) -> int:
    """Fuses every module's `FUSED_PROJECTIONS` groups whose members are plain bias-free linears on one device and
    dtype (quantized ones are skipped). Returns how many groups were fused."""
    n = 0
    for mod in model.modules():
        names = getattr(mod, "FUSED_PROJECTIONS", None)
        if names is None:
            continue
        mods = [getattr(mod, a, None) for a in names]
        if None not in mods and _fusable(mods):
            mod._fused_projection = FusedProjection(mods)
            n += 1
    return n


def project(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
    """[owner.<name>(x) for name in names], as one GEMM when `fuse_projections` fused them and they still hold."""
    mods = [getattr(owner, a) for a in names]
    fused = owner.__dict__.get("_fused_projection")
    if fused is not None and not torch.is_grad_enabled() and fused.holds(mods):
        return list(F.linear(x, fused.weight).split(fused.sizes, dim=-1))
    return [m(x) for m in mods]
