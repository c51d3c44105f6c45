"""Memory estimate of a run before anything is allocated: model weights, SSM state slots, KV pool and
the workload's per-sequence buffers, against what the device has. A run that cannot fit is refused
with one line naming the key that asks for the most, instead of being killed for memory later."""
from __future__ import annotations

import math

GiB = 2 ** 30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp32": 4, "bf16": 2}


def available_bytes(device) -> int:
    import torch
    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _arch(cfg):
    from synodic.models.config import HybridConfig
    from synodic.models.presets import PRESETS
    try:
        return cfg.model.architecture()
    except Exception:  # a damaged checkpoint is reported by the model group's validator
        return HybridConfig.model_validate({**PRESETS[cfg.model.kind].model_dump(), **cfg.model.overrides})


def n_params(arch) -> int:
    import torch

    from synodic.models.lm import HybridLM
    with torch.device("meta"):
        return sum(p.numel() for p in HybridLM(arch).parameters())


def estimate(cfg) -> dict[str, tuple[str, int]]:
    """{what: (the key that sizes it, bytes)}."""
    a = _arch(cfg)
    wbytes = _DTYPE_BYTES.get(str(cfg.model.dtype), 4)
    out = {"model weights": (f"model={cfg.model.kind}", n_params(a) * wbytes)}
    p = cfg.pipeline
    if p.kind == "train":
        # params + grads + two AdamW moments, fp32 (activations depend on the scan kernels: not estimated)
        out["model weights"] = (f"model={cfg.model.kind}", n_params(a) * 16)
        return out
    slots = cfg.runtime.max_slots
    mamba = a.count("mamba2") * (a.mamba_num_heads * a.mamba_head_dim * a.ssm_state_size * 4 +
                                 (a.mamba_num_heads * a.mamba_head_dim + 2 * a.n_groups * a.ssm_state_size) *
                                 a.conv_kernel * 4)
    gdn = a.count("gdn") * (a.linear_num_value_heads * a.linear_key_head_dim * a.linear_value_head_dim * 4 +
                            (2 * a.linear_num_key_heads * a.linear_key_head_dim +
                             a.linear_num_value_heads * a.linear_value_head_dim) * a.linear_conv_kernel_dim * 4)
    out["SSM state slots"] = ("runtime.max_slots", slots * (mamba + gdn))
    kv = cfg.kv
    per_token = a.count("attention") * a.num_key_value_heads * a.head_dim * 2 * wbytes
    blocks = getattr(kv, "num_blocks", 0) + getattr(kv, "host_num_blocks", 0)
    out["KV pool"] = ("kv.num_blocks", blocks * getattr(kv, "block_size", 16) * per_token)
    wl = cfg.workload
    seq = (getattr(wl, "prompt_len", 0) + getattr(wl, "output_len", 0) + getattr(wl, "max_tokens", 0) + 1)
    seq = max(seq, getattr(p, "max_tokens", 0) or 0)
    key = "workload.max_tokens" if hasattr(wl, "max_tokens") else "workload.output_len"
    # per slot: block table row, token and position buffers (int64), one step's fp32 logits
    out["workload buffers"] = (key, slots * (math.ceil(seq / getattr(kv, "block_size", 16)) * 4 + seq * 16) +
                               slots * a.vocab_size * 4)
    return out


def check_fits(cfg, device, fraction: float = 0.9) -> None:
    from .errors import ConfigError
    est = estimate(cfg)
    total = sum(b for _, b in est.values())
    have = available_bytes(device)
    if total <= fraction * have:
        return
    what, (key, b) = max(est.items(), key=lambda kv: kv[1][1])
    parts = ", ".join(f"{w} {v / GiB:.1f}" for w, (_, v) in est.items())
    val = key.split("=", 1)[1] if "=" in key else _value(cfg, key)
    name = key.split("=", 1)[0]
    raise ConfigError([f"{name}={val!r}: the run needs an estimated {total / GiB:.1f} GiB ({parts} GiB; "
                       f"{what} the largest) but the {getattr(device, 'type', device)} has {have / GiB:.1f} GiB; "
                       f"expected a smaller {name} (or a bigger device)"])


def _value(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part, None)
    return obj
