"""Quantizing a model: which linears, calibration, per-layer solving, the store key, swapping modules.

Used by `quant=<format>` (BlockQuant.build -> apply_quant) and by pipeline=quantize (solve_group /
solve_group_to_part, one call per layer group, inline or as Ray tasks). Both produce the same tensors
for the same model and config, so a decode run gives the same outputs from a stored artifact as from
quantizing on the fly.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from synodic.quant import store
from synodic.quant.formats import get_format
from synodic.quant.methods import solve_full
from synodic.quant.qtensor import QTensor

IDENTITY_SAMPLES = 65536  # elements hashed per tensor (a strided sample: the exact bytes, any device)


# ---------------------------------------------------------------- which layers
def select_linears(model: nn.Module, patterns: list[str], fmt: str) -> tuple[list[str], dict[str, str]]:
    """(names of the nn.Linear modules to quantize, {name: why not} for matches that cannot be).

    A pattern matches by fnmatch. Linears outside the blocks (lm_head) only match a pattern equal to
    their name, so 'blocks.*'-style globs, and even '*', keep the head in high precision."""
    block = get_format(fmt).block
    names, skipped = [], {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        inside = name.startswith("blocks.")
        if not any(fnmatch.fnmatchcase(name, p) if inside else name == p for p in patterns):
            continue
        if mod.in_features % block:
            skipped[name] = f"in_features={mod.in_features} is not a multiple of the {fmt} block {block}"
            continue
        names.append(name)
    return names, skipped


def checked_linears(model: nn.Module, qcfg) -> tuple[list[str], dict[str, str]]:
    """select_linears for quant config `qcfg`, refusing a selection that quantizes nothing and a pattern that
    matches no nn.Linear (a typo beside a good pattern would otherwise leave its layers in high precision
    silently)."""
    from synodic.config.errors import ConfigError
    names, skipped = select_linears(model, qcfg.layers, qcfg.kind)
    hint = "expected patterns such as 'blocks.*' or 'blocks.*.mixer.*_proj'"
    if not names:
        raise ConfigError([f"quant.layers={list(qcfg.layers)}: matched no quantizable nn.Linear; {hint}"])
    idle = [p for p in qcfg.layers if select_linears(model, [p], qcfg.kind) == ([], {})]
    if idle:
        raise ConfigError([f"quant.layers={list(qcfg.layers)}: {', '.join(map(repr, idle))} matched no nn.Linear; "
                           f"{hint}"])
    return names, skipped


def group_of(name: str) -> str:
    """Layer group = one block ('blocks.7'); anything else is its own group."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 2 else name


def groups(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(group_of(n), []).append(n)
    return out


# ---------------------------------------------------------------- store key
def model_identity(model: nn.Module) -> str:
    """Hash of the weights: name, shape, dtype and a strided sample of the exact bytes of every tensor
    of the state dict. Same value on every device; cheap for an 8B model on the GPU."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach()
        flat = t.reshape(-1)
        step = max(1, flat.numel() // IDENTITY_SAMPLES)
        sample = flat[::step][:IDENTITY_SAMPLES].contiguous().cpu()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
    return h.hexdigest()[:16]


def artifact_hash(identity: str, qcfg) -> str:
    blob = json.dumps({"model": identity, "quant": qcfg.artifact_key()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve_artifact(qcfg, key: str) -> Path | None:
    """The complete artifact for this key, or None (quantize on the fly). Raises ConfigError for an
    explicit quant.artifact path that does not hold it."""
    from synodic.config.errors import ConfigError
    if qcfg.artifact == "none":
        return None
    if qcfg.artifact == "auto":
        adir = store.default_store() / key
        return adir if store.is_complete(adir) else None
    p = Path(qcfg.artifact)
    if store.is_complete(p):
        got = store.read_manifest(p).get("hash")
        if got != key:
            raise ConfigError([f"quant.artifact={qcfg.artifact!r}: made for another model or quant config "
                               f"(hash {got}); this run needs {key}: run pipeline=quantize with it"])
        return p
    if store.is_complete(p / key):
        return p / key
    raise ConfigError([f"quant.artifact={qcfg.artifact!r}: no complete artifact {key} there; expected auto, "
                       f"none, or a directory written by pipeline=quantize"])


# ---------------------------------------------------------------- calibration (SmoothQuant)
def calibration_ids(vocab_size: int, samples: int, length: int) -> torch.Tensor:
    """[samples, length] token ids from train-split stdlib documents (never the held-out shard):
    the shipped tokenizer when the vocab matches it, else UTF-8 bytes."""
    from synodic.data.corpus import _read, is_heldout, stdlib_root
    from synodic.data.tokenizer import SHIPPED_TOKENIZER, load_tokenizer
    tok = None
    if SHIPPED_TOKENIZER.is_file():
        t = load_tokenizer()
        tok = t if t.vocab_size == vocab_size else None
    need, ids = samples * length, []
    for path in sorted(stdlib_root().glob("*.py")):
        if is_heldout(path.name):
            continue
        text = _read(path)
        if text:
            ids += tok.encode(text) if tok else [b % vocab_size for b in text.encode("utf-8")]
        if len(ids) >= need:
            break
    if len(ids) < need:  # a stripped-down Python: repeat what there is
        ids = (ids or [0]) * (need // max(1, len(ids)) + 1)
    return torch.tensor(ids[:need], dtype=torch.long).reshape(samples, length)


@torch.no_grad()
def calibrate(model: nn.Module, names: list[str], ids: torch.Tensor, batch: int = 4) -> dict[str, torch.Tensor]:
    """max |x_j| per input channel of each named linear over the calibration tokens (fp32, on CPU)."""
    mods = dict(model.named_modules())
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def f(_m, inp, _out):
            a = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0).float()
            amax[name] = a if name not in amax else torch.maximum(amax[name], a)
        return f

    handles = [mods[n].register_forward_hook(hook(n)) for n in names]
    try:
        dev = next(model.parameters()).device
        for i in range(0, ids.shape[0], batch):
            model(ids[i:i + batch].to(dev))
    finally:
        for h in handles:
            h.remove()
    return {n: a.cpu() for n, a in amax.items()}


# ---------------------------------------------------------------- solving
def solve_linear(weight: torch.Tensor, fmt: str, method: str, opts: dict,
                 act_absmax: torch.Tensor | None = None) -> tuple[dict, dict]:
    """One weight -> ({qdata, qscale, qtensor_scale, act_scale}, stats). rel_mse = ||W - W_eff||^2 /
    ||W||^2 with W_eff = dequant(Q(W / s)) * s, the weight the layer effectively applies."""
    t0 = time.perf_counter()
    if method == "smoothquant":
        opts = {**opts, "act_absmax": act_absmax}
    sol = solve_full(weight, fmt, method, **opts)
    w = weight.detach().float()
    err = (w - sol.effective_weight()).pow(2).sum() / w.pow(2).sum().clamp_min(1e-30)
    stats = {"shape": list(weight.shape), "rel_mse": float(err), "solve_s": time.perf_counter() - t0}
    if "best_iter" in sol.info:
        stats["best_iter"] = sol.info["best_iter"]
    q = sol.q
    return {"qdata": q.data, "qscale": q.scale, "qtensor_scale": q.tensor_scale, "act_scale": sol.s}, stats


def solve_group(weights: dict[str, torch.Tensor], fmt: str, method: str, opts: dict,
                act_absmax: dict | None = None, device: str | None = None) -> tuple[dict, dict]:
    layers, stats = {}, {}
    for name, w in weights.items():
        w = w.to(device) if device else w
        a = None if act_absmax is None else act_absmax[name].to(w.device)
        layers[name], stats[name] = solve_linear(w, fmt, method, opts, a)
    return layers, stats


def solve_group_to_part(adir: str, group: str, weights: dict, fmt: str, method: str, opts: dict,
                        act_absmax: dict | None = None, device: str | None = None, threads: int | None = None
                        ) -> dict:
    """A quantize-pipeline task: solve one layer group and write its part file atomically. Returns
    the group's stats (runs in a Ray worker or in process)."""
    if threads:
        torch.set_num_threads(threads)
    layers, stats = solve_group(weights, fmt, method, opts, act_absmax, device)
    store.write_part(Path(adir), group, layers, stats)
    return stats


# ---------------------------------------------------------------- the scheme
@dataclass
class QuantScheme:
    """What quant=<format> did to the model (graph.quant). `summary()` goes into results."""
    format: str
    method: str
    mode: str
    act_quant: bool
    layers: list[str]
    skipped: dict[str, str]
    source: str  # "artifact" | "on_the_fly"
    artifact: str | None
    hash: str
    emulated: bool
    emulation: str
    kernel: bool
    weight_bytes: int
    dense_bytes: int
    resident_bytes: int
    dense_copy: bool
    rel_mse: dict[str, float] = field(default_factory=dict)
    dense_copy_why: str | None = None  # quant.dense_copy=auto: what decided it
    build_s: float = 0.0

    def summary(self) -> dict:
        d = asdict(self)
        errs = list(self.rel_mse.values())
        d["n_layers"] = len(self.layers)
        d["rel_mse_mean"] = sum(errs) / len(errs) if errs else None
        d["rel_mse_max"] = max(errs) if errs else None
        return d

    def line(self) -> str:
        src = f"artifact {self.artifact}" if self.source == "artifact" else "quantized on the fly"
        mean = self.summary()["rel_mse_mean"]
        return (f"quant: {self.format} {self.mode} {self.method}, {len(self.layers)} linears ({src}, "
                f"{self.build_s:.1f}s), weights {self.dense_bytes / 2**20:.1f} -> {self.weight_bytes / 2**20:.1f} MiB "
                f"packed, {self.resident_bytes / 2**20:.1f} MiB resident"
                f"{' (dense copy kept)' if self.dense_copy else ' (no dense copy)'}"
                f"{f' [dense copy {self.dense_copy_why}]' if self.dense_copy_why else ''}, "
                f"mean rel. MSE {mean:.2e}; " + ("EMULATED: " if self.emulated else "") + self.emulation)


def emulation(device: torch.device, fmt: str, bits: int, act_quant: bool, backend: str,
              dense_copy: bool = True) -> tuple[bool, bool, str]:
    """(emulated, packed kernel used for decode, why)."""
    from synodic.kernels.quant_linear import KERNEL_FORMATS
    if device.type != "cuda":
        return True, False, ("CPU: no native MX / NVFP4 / INT4 arithmetic; weights dequantized to the model dtype"
                             + ("" if dense_copy else " per call")
                             + (", activations fake-quantized in torch" if act_quant else ""))
    kernel = fmt in KERNEL_FORMATS and backend != "torch"
    cap = torch.cuda.get_device_capability(device)
    if act_quant:
        hw = (f"sm_{cap[0]}{cap[1]} has no FP4 tensor cores (native W4A4 needs Blackwell, sm_100)" if bits == 4
              and cap < (10, 0) else "no native block-scaled low-precision matmul in synodic")
        how = "x*s and the activation quantizer fused in the packed kernel" if kernel else "in torch"
        return True, kernel, f"{hw}: activations fake-quantized ({how}), matmul in the model dtype"
    if kernel:
        from synodic.quant.linear import KERNEL_MAX_ROWS, PACKED_ONLY_MAX_ROWS
        if not dense_copy:
            return False, True, (f"decode steps of up to {PACKED_ONLY_MAX_ROWS[fmt]} rows read the packed weights "
                                 "(dequantized in-kernel); larger batches and prefill dequantize each weight per call "
                                 "and run the matmul in the model dtype")
        return False, True, (f"decode steps of up to {KERNEL_MAX_ROWS[fmt]} rows read the packed weights (dequantized "
                             "in-kernel); larger batches and prefill use the dequantized weights in the model dtype")
    return True, False, (f"no packed kernel for {fmt}: weights dequantized to the model dtype "
                         "(the ledger counts packed bytes)")


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def apply_quant(model: nn.Module, qcfg, device: torch.device | str | None = None) -> QuantScheme:
    """Swap the selected linears of `model` for QuantLinear (from the store when it has this model +
    config, else solved here, on the model's device). Returns the scheme description."""
    from synodic.config.errors import ConfigError
    from synodic.quant.linear import QuantLinear
    t0 = time.perf_counter()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    names, skipped = checked_linears(model, qcfg)
    key = artifact_hash(model_identity(model), qcfg)
    adir = resolve_artifact(qcfg, key)
    mods = dict(model.named_modules())
    if adir is not None:
        manifest, stored = store.load(adir, device)
        missing = [n for n in names if n not in stored]
        if missing:
            raise ConfigError([f"quant.artifact: {adir} lacks layers {missing[:3]}; re-run pipeline=quantize"])
        rel = {n: manifest["layers"][n]["rel_mse"] for n in names}
    else:
        absmax = None
        if qcfg.method == "smoothquant":
            ids = calibration_ids(model.config.vocab_size, qcfg.calib_samples, qcfg.calib_len)
            absmax = calibrate(model, names, ids)
        stored, rel = {}, {}
        for n in names:
            a = None if absmax is None else absmax[n].to(device)
            stored[n], st = solve_linear(mods[n].weight, qcfg.kind, qcfg.method, qcfg.method_opts(), a)
            rel[n] = st["rel_mse"]
    # "auto" is resolved by QuantConfig.build from the graph's rows; called without a graph, keep the copy
    keep = qcfg.dense_copy is not False
    dense = wbytes = resident = 0
    for n in names:
        lin, t = mods[n], stored[n]
        q = QTensor(qcfg.kind, t["qdata"], t["qscale"], t["qtensor_scale"], tuple(lin.weight.shape))
        ql = QuantLinear.from_packed(q, t["act_scale"], lin.bias, mode=qcfg.resolved_mode, method=qcfg.method,
                                     rule=qcfg.rule, dtype=lin.weight.dtype, backend=qcfg.backend,
                                     dense=keep).to(device)
        dense += lin.weight.numel() * lin.weight.element_size()
        wbytes += ql.packed_bytes()
        resident += ql.resident_bytes()
        _set_module(model, n, ql)
    emulated, kernel, why = emulation(device, qcfg.kind, qcfg.bits, qcfg.act_quant, qcfg.backend, keep)
    scheme = QuantScheme(format=qcfg.kind, method=qcfg.method, mode=qcfg.resolved_mode, act_quant=qcfg.act_quant,
                         layers=names, skipped=skipped, source="artifact" if adir is not None else "on_the_fly",
                         artifact=None if adir is None else str(adir), hash=key, emulated=emulated, emulation=why,
                         kernel=kernel, weight_bytes=wbytes, dense_bytes=dense, resident_bytes=resident,
                         dense_copy=keep, rel_mse=rel,
                         build_s=time.perf_counter() - t0)
    return scheme
