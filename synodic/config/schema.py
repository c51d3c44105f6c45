"""RunConfig: one field per group, each the tagged union of that group's registered components,
plus the cross-component rules in a single validator."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model, model_validator

from .errors import ConfigError, format_validation_error
from .registry import GROUPS, REGISTRIES, Component, numeric_bool_problems, seed_problems


class _RunBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _cross(self):
        problems = cross_rules(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def cross_rules(cfg) -> list[str]:
    """Rules spanning groups; each message names the keys and values involved."""
    out = []
    p, rt, kv, wl = cfg.pipeline, cfg.runtime, cfg.kv, cfg.workload
    if rt.device == "cpu" and rt.cuda_graphs:
        out.append("runtime.cuda_graphs=true with runtime.device=cpu: expected runtime.cuda_graphs=false "
                   "(CUDA graphs need a GPU)")
    # cuda_graphs=null is the setting that falls back; an explicit true on a machine without CUDA is refused as
    # for device=cpu, so a run (or a bench row) never records CUDA graphs it did not use
    if rt.device == "auto" and rt.cuda_graphs and _no_cuda():
        out.append("runtime.cuda_graphs=true with runtime.device=auto on a machine without CUDA: expected "
                   "runtime.cuda_graphs=null (on where there is a GPU) or false")
    # training sizes the vocabulary from its tokenizer, so an override of it would be silently replaced
    if p.kind == "train" and "vocab_size" in getattr(cfg.model, "overrides", {}):
        v = cfg.model.overrides["vocab_size"]
        out.append(f"model.overrides.vocab_size={v} with pipeline=train (the model's vocabulary is its tokenizer's): "
                   f"expected pipeline.vocab_size={v}, a tokenizer trained to that size, and no "
                   "model.overrides.vocab_size")
    if getattr(p, "batch_sizes", None) and max(p.batch_sizes) > rt.max_slots:
        out.append(f"pipeline.batch_sizes={list(p.batch_sizes)} with runtime.max_slots={rt.max_slots}: "
                   f"expected every batch size <= runtime.max_slots")
    if rt.kind == "ray" and p.kind not in ("decode", "bench"):
        out.append(f"runtime=ray with pipeline={p.kind}: expected pipeline=decode or bench (the pipelines served by "
                   f"replicas), or runtime=local")
    if getattr(cfg.ssm, "kernel", None) == "triton" and _no_gpu(rt.device):
        out.append(f"ssm.kernel=triton with runtime.device={rt.device} on a machine without a GPU: expected "
                   f"ssm.kernel=auto or ref (Triton kernels need CUDA, or TRITON_INTERPRET=1 to emulate them)")
    if getattr(cfg.quant, "backend", None) == "triton":
        from synodic.kernels.quant_linear import KERNEL_FORMATS
        if cfg.quant.kind not in KERNEL_FORMATS:
            fmts = " or ".join(KERNEL_FORMATS)
            out.append(f"quant.backend=triton with quant={cfg.quant.kind}: expected quant={fmts} (the formats the "
                       f"packed kernel reads), or quant.backend=auto or torch")
        elif _no_gpu(rt.device):
            out.append(f"quant.backend=triton with runtime.device={rt.device} on a machine without a GPU: expected "
                       f"quant.backend=auto or torch (Triton kernels need CUDA, or TRITON_INTERPRET=1 to emulate "
                       f"them)")
    # a forward-pass comparison cannot differ in what the forward pass does not run
    ref_groups = sorted({"ssm", "kv"} & set(getattr(p, "reference", None) or {})) if p.kind == "eval" else []
    if ref_groups and p.path == "forward":
        out.append(f"pipeline.reference replacing {' and '.join(ref_groups)} with pipeline.path=forward: expected "
                   f"pipeline.path=decode (whole-window forward passes run no state backend or KV policy)")
    need = getattr(wl, "prompt_len", 0) + getattr(wl, "output_len", 0)
    if need and hasattr(kv, "capacity_tokens") and need > kv.capacity_tokens():
        out.append(f"workload.prompt_len+output_len={need} with kv={kv.kind} holding {kv.capacity_tokens()} "
                   f"tokens: expected the KV pool to hold at least one request")
    return out


def _no_cuda() -> bool:
    import torch
    return not torch.cuda.is_available()


def _no_gpu(device: str) -> bool:
    """Whether a Triton kernel forced on `device` cannot run: no CUDA there and no TRITON_INTERPRET emulation."""
    import os
    if os.environ.get("TRITON_INTERPRET"):
        return False
    return device == "cpu" or (device == "auto" and _no_cuda())


@lru_cache(maxsize=1)
def run_config_class() -> type[BaseModel]:
    from .components import load_all
    load_all()
    fields = {g: (REGISTRIES[g].schema(), ...) for g in GROUPS}
    return create_model("RunConfig", __base__=_RunBase, **fields)


def validate(raw: dict[str, Any]):
    """Raw composed dict → RunConfig, or ConfigError with one line per problem."""
    cls = run_config_class()
    missing = [g for g in GROUPS if g not in raw]
    extra = [k for k in raw if k not in GROUPS]
    if missing or extra:
        raise ConfigError([f"{k}: missing group; expected one of {', '.join(REGISTRIES[k].kinds())}"
                           for k in missing] +
                          [f"{k}: unknown group; expected one of {', '.join(GROUPS)}" for k in extra])
    bools = [line for g in GROUPS if isinstance(raw[g], dict)
             for line in numeric_bool_problems(g, REGISTRIES[g].classes.get(raw[g].get("kind"), Component),
                                               raw[g])]
    bools += seed_problems({g: raw[g] for g in GROUPS})
    if bools:
        raise ConfigError(bools)
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        lines = format_validation_error(e, REGISTRIES)
        # the cross-rule validator joins its problems with '; '
        raise ConfigError([s for line in lines for s in _split_cross(line)]) from None


def _split_cross(line: str) -> list[str]:
    if line.startswith("<root>="):
        msg = line.split(": ", 1)[1] if ": " in line else line
        return msg.split("; ")
    return [line]


def config_hash(cfg) -> str:
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
