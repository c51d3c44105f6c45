"""Trainer checkpoints without pickle: tensors in `state.safetensors`, everything else in `state.json`.

A run directory may come from anywhere (a shared disk, a downloaded run), and unpickling a file runs
whatever code it names, so resume never unpickles. The nested state (model, optimiser, sampler, RNG,
history) is walked once: each tensor goes to safetensors under its path, the JSON skeleton keeps a
`{"__tensor__": path}` marker in its place; tuples and dicts with non-string keys (the optimiser's
per-parameter state) are tagged so they load back as they were saved."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

TENSORS, META = "state.safetensors", "state.json"


def _encode(obj, path: str, tensors: dict):
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous()
        return {"__tensor__": path}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {"__dict__": {k: _encode(v, f"{path}/{k}", tensors) for k, v in obj.items()}}
        return {"__items__": [[k, _encode(v, f"{path}/{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{path}: {type(obj).__name__} cannot be stored in a checkpoint")


def _decode(obj, tensors: dict):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__dict__" in obj:
        return {k: _decode(v, tensors) for k, v in obj["__dict__"].items()}
    if "__items__" in obj:
        return {k: _decode(v, tensors) for k, v in obj["__items__"]}
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    raise ValueError(f"unexpected checkpoint entry {sorted(obj)}")


def save_state(state: dict, ckpt_dir: str | Path) -> None:
    """Write both files under unique temporary names, then rename: a crash leaves the old pair."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    meta = _encode(state, "", tensors)
    # Tensors sharing storage (tied weights) must be separate in safetensors.
    tensors = {k: v.clone() for k, v in tensors.items()}
    fd, tmp_t = tempfile.mkstemp(prefix=".state.", suffix=".safetensors", dir=ckpt_dir)
    os.close(fd)
    fd, tmp_j = tempfile.mkstemp(prefix=".state.", suffix=".json", dir=ckpt_dir)
    try:
        save_file(tensors, tmp_t)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        # JSON last: its presence marks a complete pair.
        os.replace(tmp_t, ckpt_dir / TENSORS)
        os.replace(tmp_j, ckpt_dir / META)
    finally:
        for t in (tmp_t, tmp_j):
            if os.path.exists(t):
                os.unlink(t)


def has_state(ckpt_dir: str | Path) -> bool:
    d = Path(ckpt_dir)
    return (d / META).is_file() and (d / TENSORS).is_file()


def load_state(ckpt_dir: str | Path, device="cpu") -> dict:
    """Inverse of save_state; raises ValueError on a damaged pair (the caller names the path)."""
    d = Path(ckpt_dir)
    try:
        meta = json.loads((d / META).read_text())
        tensors = load_file(str(d / TENSORS), device=str(device))
        return _decode(meta, tensors)
    except (OSError, json.JSONDecodeError, KeyError, ValueError, RuntimeError, SafetensorError) as e:
        raise ValueError(f"{d}: damaged checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None


# Settings a resumed run may change: they do not alter the optimisation already done.
RESUMABLE = {"max_steps", "time_budget_s", "eval_every", "eval_tokens", "ckpt_every", "log_every", "device",
             "precision", "save_dtype", "resume", "halt_at_step", "final_eval", "export_to"}


def resume_conflicts(saved: dict, now: dict, saved_arch: dict, arch: dict, step: int) -> list[str]:
    """One line per setting whose change makes the saved state unusable for this run."""
    out = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k), now.get(k)
        if k in RESUMABLE or a == b:
            continue
        out.append(f"pipeline.{k}={b!r}: the checkpoint was trained with {a!r}")
    if now.get("max_steps") is not None and now["max_steps"] < step:
        out.append(f"pipeline.max_steps={now['max_steps']}: the checkpoint is already at step {step}")
    if saved_arch and saved_arch.get("model_type") != arch.get("model_type"):
        # another architecture altogether: one line, not every field that differs
        out.append(f"model={_name(arch)}: the checkpoint holds a {_name(saved_arch)} model, another architecture")
        return out
    for k in sorted(set(saved_arch) | set(arch)):
        if saved_arch.get(k) != arch.get(k):
            out.append(f"model.{k}={arch.get(k)!r}: the checkpoint's model has {saved_arch.get(k)!r}")
    return out


def _name(arch: dict) -> str:
    """The preset an architecture is (vocab_size aside: training sizes it to the tokenizer), else its
    model_type."""
    from synodic.models.presets import PRESETS
    for name, pre in PRESETS.items():
        d = pre.model_dump(mode="json")
        if {**d, "vocab_size": None} == {**arch, "vocab_size": None}:
            return name
    return f"{arch.get('model_type')} ({arch.get('num_hidden_layers')} layers, hidden_size {arch.get('hidden_size')})"
