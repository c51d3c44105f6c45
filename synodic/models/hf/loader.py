"""Shared part of Hugging Face folder loading: config.json / shard discovery, a dry run of the
tensor mapping on the meta device (names, shapes, coverage: every problem is found before a byte
reaches the device), then streaming shard by shard with safetensors' safe_open onto the device in
the model's dtype. The per-architecture mapping (config fields, tensor names and layouts) lives in
one module per family (nemotron_h.py, qwen3_next.py)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import ValidationError

from synodic.config.errors import ConfigError
from synodic.config.files import shown

from ..config import HybridConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# a converted piece: (synodic parameter name, tensor, rows of that parameter it fills or None = all of it)
Piece = tuple[str, torch.Tensor, "slice | int | None"]


class CheckpointError(ConfigError):
    """A Hugging Face folder synodic cannot load: one line naming the file and what was expected (exit 2)."""

    def __init__(self, line: str):
        super().__init__([line])


@dataclass
class Source:
    """One on-disk tensor synodic reads: its expected shape and how it becomes synodic's tensors."""
    shape: tuple[int, ...]
    convert: Callable[[torch.Tensor], list[Piece]]


@dataclass
class Mapping:
    """What an architecture family's module hands the loader for one folder."""
    config: HybridConfig
    sources: dict[str, Source]
    zero: list[str] = field(default_factory=list)  # synodic parameters the format has no tensor for (zero bias)
    ignore: tuple[str, ...] = (r"^mtp\.", r"rotary_emb\.inv_freq$")  # on-disk tensors synodic does not use


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} cannot be read as JSON ({str(e).splitlines()[0][:80]}); expected {what}") \
            from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}; expected {what} (a JSON object)")
    return data


def validated(fields: dict, where: Path) -> HybridConfig:
    """HybridConfig of the mapped fields; a violated rule is one line naming config.json."""
    try:
        return HybridConfig.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(map(str, err["loc"]))
        raise CheckpointError(f"{where}: {loc + ': ' if loc else ''}{err['msg'].removeprefix('Value error, ')}; "
                              "expected a config synodic's HybridConfig accepts") from None


def pick(raw: dict, where: Path, *names: str, default=...):
    """The first of `names` present in config.json (spellings differ between Hub and transformers 5)."""
    for n in names:
        if raw.get(n) is not None:
            return raw[n]
    if default is ...:
        raise CheckpointError(f"{where} has no {' / '.join(names)}; expected it in a {raw.get('model_type')} config")
    return default


def integer(raw: dict, where: Path, *names: str, least: int = 1, default=...) -> int:
    """pick() for a field the mapping computes with before HybridConfig validates it (H // heads, range(layers)):
    an integer >= `least`, else one line naming the field."""
    v = pick(raw, where, *names, default=default)
    name = next((n for n in names if raw.get(n) is not None), names[0])
    require(isinstance(v, int) and not isinstance(v, bool) and v >= least,
            lambda: f"{where}: {name}={shown(repr(v), 60)}; expected an integer >= {least}")
    return v


def real(raw: dict, where: Path, *names: str, default=...) -> float | None:
    """pick() for a number field the mapping converts with float() (None when absent and default=None)."""
    v = pick(raw, where, *names, default=default)
    if v is None:
        return None
    name = next((n for n in names if raw.get(n) is not None), names[0])
    require(isinstance(v, (int, float)) and not isinstance(v, bool),
            lambda: f"{where}: {name}={shown(repr(v), 60)}; expected a number")
    return float(v)


def strings(v, where: Path, key: str, expected: str) -> list[str]:
    """A config.json list of names (layer types): a list of strings, else one line naming the field."""
    require(isinstance(v, list) and all(isinstance(x, str) for x in v),
            lambda: f"{where}: {key}={shown(repr(v), 60)}; expected {expected}")
    return v


def require(cond: bool, line) -> None:
    """`line`: the message, or a function making it (when it indexes what is checked)."""
    if not cond:
        raise CheckpointError(line() if callable(line) else line)


# ---------------------------------------------------------------- shards

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name → (dtype, shape) of one safetensors file, after checking that its header is well formed and its
    data all there (synodic/config/files.py's parser, shared with synodic's own checkpoints)."""
    from synodic.config.files import safetensors_header
    try:
        return safetensors_header(path)
    except (OSError, ValueError) as e:
        hint = "" if str(e).startswith("not a safetensors") else " (truncated copy?)"
        raise CheckpointError(f"{path} cannot be read ({str(e).splitlines()[0][:160]}); expected a complete "
                              f"safetensors file{hint}") from None


def shards(folder: Path) -> dict[Path, dict[str, tuple[str, tuple[int, ...]]]]:
    """Every shard's header, from model.safetensors.index.json or the one model.safetensors."""
    idx = folder / INDEX
    if idx.is_file():
        wm = read_json(idx, "a safetensors index with a weight_map").get("weight_map")
        require(isinstance(wm, dict) and wm, f"{idx} has no weight_map; expected {{tensor name: shard file}}")
        out = {}
        for name in sorted(set(wm.values()), key=str):
            p = folder / str(name)
            require(p.is_file(), f"{idx} lists shard {name}, which is not in {folder}; expected every shard "
                                 "the index names")
            out[p] = header(p)
        for k, name in wm.items():
            require(k in out[folder / str(name)], f"{folder / str(name)} has no tensor {k!r}; expected it there "
                                                  f"({idx} says so)")
        return out
    single = folder / SINGLE
    require(single.is_file(), f"{folder} has neither {SINGLE} nor {INDEX}; expected the safetensors weights of "
                              "a Hugging Face checkpoint")
    return {single: header(single)}


# ---------------------------------------------------------------- plan and load

@dataclass
class Plan:
    mapping: Mapping
    reads: list[tuple[Path, list[str]]]  # shard → the tensors to read from it
    nbytes: int


def plan(folder: Path, mapping: Mapping) -> Plan:
    """Dry run on the meta device: every source present once with its shape, every converted piece the
    shape of its destination, every synodic parameter covered."""
    from ..lm import HybridLM
    with torch.device("meta"):
        model = HybridLM(mapping.config)
    params = dict(model.named_parameters(remove_duplicate=True))
    if mapping.config.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    covered = dict.fromkeys(params, 0)
    found: dict[str, Path] = {}
    reads, nbytes = [], 0
    ignore = [re.compile(p) for p in mapping.ignore]
    tied_head = mapping.config.tie_word_embeddings
    for shard, head in shards(folder).items():
        keys = []
        for k, (dt, shape) in head.items():
            src = mapping.sources.get(k)
            if src is None:
                if any(p.search(k) for p in ignore) or (tied_head and k == "lm_head.weight"):
                    continue
                example = next(iter(mapping.sources))
                raise CheckpointError(f"{shard}: tensor {k!r} is not part of the {mapping.config.model_type} layout "
                                      f"config.json describes; expected names such as {example!r}")
            require(k not in found, f"{shard}: tensor {k!r} is also in {found.get(k)}; expected it in one shard")
            require(dt in _DTYPES, f"{shard}: tensor {k!r} has dtype {dt}; expected a float dtype")
            require(shape == src.shape, f"{shard}: tensor {k!r} has shape {list(shape)}; expected "
                                        f"{list(src.shape)} from config.json")
            found[k] = shard
            for name, t, rows in src.convert(torch.empty(shape, dtype=_DTYPES[dt], device="meta")):
                dst = params[name] if rows is None else params[name][rows]
                require(tuple(t.shape) == tuple(dst.shape), f"{shard}: tensor {k!r} maps to {name} of shape "
                        f"{list(dst.shape)}; got {list(t.shape)}")
                covered[name] += dst.numel()
            keys.append(k)
            nbytes += torch.Size(shape).numel() * _DTYPES[dt].itemsize
        if keys:
            reads.append((shard, keys))
    missing = [k for k in mapping.sources if k not in found]
    require(not missing, lambda: f"{folder}: no tensor {missing[0]!r} in any shard ({len(missing)} missing); "
                                 "expected every tensor of the layout config.json describes")
    for name in mapping.zero:
        covered[name] = params[name].numel()
    short = [n for n, c in covered.items() if c != params[n].numel()]
    require(not short, lambda: f"{folder}: synodic parameter {short[0]} is not fully covered by the checkpoint's "
                               "tensors; expected a complete checkpoint")
    return Plan(mapping, reads, nbytes)


def materialize(p: Plan, device, dtype, progress: bool = True):
    """Build the model on `device` in `dtype` and stream every shard into it (one tensor in host memory
    at most: safe_open reads each tensor straight to `device`)."""
    from safetensors import safe_open

    from ..lm import HybridLM
    device = torch.device(device)
    cfg = p.mapping.config
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = HybridLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gives each module its own tensor; share the embedding again
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters())
    dev = f"cuda:{device.index or 0}" if device.type == "cuda" else str(device)
    try:
        with torch.no_grad(), _progress(progress, p.nbytes) as advance:
            for name in p.mapping.zero:
                params[name].zero_()
            for shard, keys in p.reads:
                with safe_open(str(shard), framework="pt", device=dev) as f:
                    for k in keys:
                        t = f.get_tensor(k)
                        for name, part, rows in p.mapping.sources[k].convert(t):
                            (params[name] if rows is None else params[name][rows]).copy_(part)
                        advance(t.numel() * t.element_size())
                        del t
    except BaseException:
        del model, params  # nothing loaded halfway stays allocated
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise
    return model


class _progress:
    """A rich progress bar over the bytes read (on stderr; silent when off)."""

    def __init__(self, on: bool, total: int):
        self.on, self.total = on, total

    def __enter__(self):
        if not self.on:
            return lambda n: None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
        self.bar = Progress(TextColumn("loading weights"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("load", total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc):
        if self.on:
            self.bar.__exit__(*exc)
        return False
