"""On-disk store of quantized checkpoints, keyed by a hash of (model weights identity, quant config).

    <store>/<hash>/parts/<group>.safetensors   one per layer group (a block), written atomically as
                                               each finishes: a killed job resumes at the next group
    <store>/<hash>/quantized.safetensors       every quantized linear: <name>.qdata / .qscale
                                               (/ .qtensor_scale / .act_scale), merged from the parts
    <store>/<hash>/manifest.json               written last: its presence means the artifact is complete

Every file is written to a dot-prefixed temporary name in the same directory and renamed into place,
so a reader (or a resumed job) never sees half a file. Stats per layer travel in each part's
safetensors metadata (JSON) and end up in the manifest.

Damage after the write (a flipped byte, a truncated copy, a lost file) is found by checksums, not
trusted: each part has a `<group>.safetensors.sha256` beside it (written after the part: a part without
one is unfinished and solved again), and the manifest records the sha256 of quantized.safetensors.
Both are checked on every read; a mismatch is one ConfigError line naming the file.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

STORE_ENV = "SYNODIC_QUANT_STORE"
PARTS = "parts"
CKPT = "quantized.safetensors"
MANIFEST = "manifest.json"
FIELDS = ("qdata", "qscale", "qtensor_scale", "act_scale")
SUM = ".sha256"  # a part's checksum file: <group>.safetensors.sha256


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


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def damaged(path: Path, why: str) -> Exception:
    from synodic.config.errors import ConfigError
    return ConfigError([f"quant.artifact: {path} is damaged ({why}); expected the bytes pipeline=quantize wrote: "
                        "rebuild with pipeline=quantize pipeline.overwrite=true"])


def atomic_save_tensors(path: Path, tensors: dict, metadata: dict | None = None) -> str:
    """Write atomically; returns the sha256 of the file's bytes (hashed from the temporary, before the
    rename, so the digest is of exactly what was written)."""
    from safetensors.torch import save_file
    tmp = _tmp(path)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        digest = sha256(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def verify(path: Path, expected: str | None) -> None:
    """ConfigError naming `path` when it is missing or its sha256 is not `expected`."""
    path = Path(path)
    if not path.is_file():
        raise damaged(path, "missing")
    if expected is None:
        return
    got = sha256(path)
    if got != expected:
        raise damaged(path, f"sha256 {got[:12]}... where {expected[:12]}... was written; flipped or truncated bytes")


def part_path(adir: Path, group: str) -> Path:
    return Path(adir) / PARTS / f"{group}.safetensors"


def done_groups(adir: Path) -> set[str]:
    """Groups whose part and checksum file are both on disk (a part without its checksum was cut off
    between the two renames: not done)."""
    d = Path(adir) / PARTS
    return {p.name[: -len(".safetensors")] for p in d.glob("*.safetensors")
            if not p.name.startswith(".") and p.with_name(p.name + SUM).is_file()} if d.is_dir() else set()


def verify_part(path: Path) -> None:
    path = Path(path)
    s = path.with_name(path.name + SUM)
    if not path.is_file():
        raise damaged(path, "missing")
    if not s.is_file():
        raise damaged(path, f"no checksum file {s.name}")
    verify(path, s.read_text().strip())


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
    # a stale checksum of an earlier, unfinished write must not vouch for the new part mid-write
    path.with_name(path.name + SUM).unlink(missing_ok=True)
    digest = atomic_save_tensors(path, flatten(layers), {"stats": json.dumps(stats)})
    atomic_write_text(path.with_name(path.name + SUM), digest + "\n")
    return path


def read_part(path: Path, device="cpu") -> tuple[dict[str, dict], dict[str, dict]]:
    """A part's layers and stats, after checking its sha256."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    verify_part(path)
    try:
        with safe_open(str(path), "pt") as f:
            stats = json.loads((f.metadata() or {}).get("stats", "{}"))
        return unflatten(load_file(str(path), device=str(device))), stats
    except Exception as e:  # matching checksum, unreadable content: written by something else
        raise damaged(path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def finalize(adir: Path, manifest: dict) -> Path:
    """Merge the parts into one checkpoint, then write the manifest (last), then drop the parts."""
    adir = Path(adir)
    tensors = {}
    for p in sorted((adir / PARTS).glob("*.safetensors")):
        if not p.name.startswith("."):
            layers, _ = read_part(p)
            tensors.update(flatten(layers))
    digest = atomic_save_tensors(adir / CKPT, tensors)
    manifest = {**manifest, "checksums": {CKPT: digest}}
    atomic_write_text(adir / MANIFEST, json.dumps(manifest, indent=2, sort_keys=False))
    for p in (adir / PARTS).glob("*.safetensors*"):
        p.unlink(missing_ok=True)
    try:
        (adir / PARTS).rmdir()
    except OSError:
        pass
    return adir / MANIFEST


def is_complete(adir: Path) -> bool:
    """The manifest is on disk (it is written last). A manifest whose checkpoint is gone is damage,
    not an unfinished job: ConfigError naming the missing file."""
    adir = Path(adir)
    if not (adir / MANIFEST).is_file():
        return False
    if not (adir / CKPT).is_file():
        raise damaged(adir / CKPT, f"missing although {MANIFEST} says the artifact is complete")
    return True


def read_manifest(adir: Path) -> dict:
    path = Path(adir) / MANIFEST
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise damaged(path, f"not readable JSON: {type(e).__name__}") from None
    if not isinstance(man, dict) or not isinstance(man.get("layers"), dict):
        raise damaged(path, "not a pipeline=quantize manifest (no 'layers' table)")
    return man


def verify_artifact(adir: Path) -> dict:
    """The manifest, after checking quantized.safetensors against the sha256 it records. An artifact
    from before checksums loads with a warning (nothing to check it against)."""
    adir = Path(adir)
    man = read_manifest(adir)
    expected = (man.get("checksums") or {}).get(CKPT)
    if expected is None:
        log.warning("quant.artifact: %s has no checksum (written before checksums); loading it unchecked. "
                    "pipeline=quantize pipeline.overwrite=true rewrites it with one", adir / MANIFEST)
    verify(adir / CKPT, expected)
    return man


def load(adir: Path, device="cpu") -> tuple[dict, dict[str, dict]]:
    """(manifest, {layer: {field: tensor}}) of a complete artifact, checked against its checksum."""
    from safetensors.torch import load_file
    adir = Path(adir)
    manifest = verify_artifact(adir)
    try:
        tensors = load_file(str(adir / CKPT), device=str(device))
    except Exception as e:  # no checksum to catch it (an old artifact): still one line, not a traceback
        raise damaged(adir / CKPT, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return manifest, unflatten(tensors)
