"""On-disk store of quantized checkpoints, keyed by a hash of (model weights identity, quant config).

    <store>/<hash>/parts/<group>.safetensors   one per layer group (a block), written atomically as
                                               each finishes: a killed job resumes at the next group
    <store>/<hash>/quantized.safetensors       every quantized linear: <name>.qdata / .qscale
                                               (/ .qtensor_scale / .act_scale), merged from the parts
    <store>/<hash>/manifest.json               written last: its presence means the artifact is complete

Every file is written to a dot-prefixed temporary name in the same directory and renamed into place,
so a reader (or a resumed job) never sees half a file. Stats per layer travel in each part's
safetensors metadata (JSON) and end up in the manifest.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

STORE_ENV = "SYNODIC_QUANT_STORE"
PARTS = "parts"
CKPT = "quantized.safetensors"
MANIFEST = "manifest.json"
FIELDS = ("qdata", "qscale", "qtensor_scale", "act_scale")


def default_store() -> Path:
    env = os.environ.get(STORE_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "outputs" / "quant_store"


def _tmp(path: Path) -> Path:
    # pid + random: tasks of one process (threads, Ray workers) never share a temporary
    return path.with_name(f".{path.name}.tmp{os.getpid()}-{secrets.token_hex(4)}")


def atomic_write_text(path: Path, text: str) -> None:
    tmp = _tmp(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_save_tensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file
    tmp = _tmp(path)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def part_path(adir: Path, group: str) -> Path:
    return Path(adir) / PARTS / f"{group}.safetensors"


def done_groups(adir: Path) -> set[str]:
    d = Path(adir) / PARTS
    return {p.name[: -len(".safetensors")] for p in d.glob("*.safetensors") if not p.name.startswith(".")} \
        if d.is_dir() else set()


def clean_tmp(adir: Path) -> None:
    """Temporaries a killed writer left behind."""
    for d in (Path(adir), Path(adir) / PARTS):
        if d.is_dir():
            for p in d.glob(".*.tmp*"):
                p.unlink(missing_ok=True)


def flatten(layers: dict[str, dict]) -> dict:
    """{layer: {field: tensor or None}} -> {"layer.field": tensor} (None fields left out)."""
    return {f"{name}.{k}": v for name, fields in layers.items() for k, v in fields.items() if v is not None}


def unflatten(tensors: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for key, v in tensors.items():
        name, field = key.rsplit(".", 1)
        out.setdefault(name, dict.fromkeys(FIELDS))[field] = v
    return out


def write_part(adir: Path, group: str, layers: dict[str, dict], stats: dict[str, dict]) -> Path:
    path = part_path(adir, group)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_tensors(path, flatten(layers), {"stats": json.dumps(stats)})
    return path


def read_part(path: Path, device="cpu") -> tuple[dict[str, dict], dict[str, dict]]:
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(str(path), "pt") as f:
        stats = json.loads((f.metadata() or {}).get("stats", "{}"))
    return unflatten(load_file(str(path), device=str(device))), stats


def finalize(adir: Path, manifest: dict) -> Path:
    """Merge the parts into one checkpoint, then write the manifest (last), then drop the parts."""
    adir = Path(adir)
    tensors = {}
    for p in sorted((adir / PARTS).glob("*.safetensors")):
        if not p.name.startswith("."):
            layers, _ = read_part(p)
            tensors.update(flatten(layers))
    atomic_save_tensors(adir / CKPT, tensors)
    atomic_write_text(adir / MANIFEST, json.dumps(manifest, indent=2, sort_keys=False))
    for p in (adir / PARTS).glob("*.safetensors"):
        p.unlink(missing_ok=True)
    try:
        (adir / PARTS).rmdir()
    except OSError:
        pass
    return adir / MANIFEST


def is_complete(adir: Path) -> bool:
    return (Path(adir) / MANIFEST).is_file() and (Path(adir) / CKPT).is_file()


def load(adir: Path, device="cpu") -> tuple[dict, dict[str, dict]]:
    """(manifest, {layer: {field: tensor}}) of a complete artifact."""
    from safetensors.torch import load_file
    adir = Path(adir)
    manifest = json.loads((adir / MANIFEST).read_text())
    return manifest, unflatten(load_file(str(adir / CKPT), device=str(device)))
