"""Hugging Face checkpoint folders: config.json (model_type nemotron_h or qwen3_next), safetensors
shards (+ model.safetensors.index.json), tokenizer.json. A folder is a Hugging Face one when its
config.json is not a synodic HybridConfig (synodic's own checkpoints keep loading as before).

- `is_hf_folder(d)`, `hf_config(d)` → HybridConfig, `load_hf(d, device, dtype)` → HybridLM,
  `hf_problems(d)` → one line per problem (what `model.weights=` reports at config time), and
  `hf_codec(d)` → the tokenizer with the folder's EOS token.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .loader import CheckpointError, Plan, materialize, plan, read_json, require, shards

FAMILIES = ("nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_text")


def is_hf_folder(d: str | Path) -> bool:
    cj = Path(d) / "config.json"
    if not cj.is_file():
        return False
    try:
        raw = json.loads(cj.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(raw, dict):
        return False
    from ..config import HybridConfig
    return bool(set(raw) - set(HybridConfig.model_fields))  # transformers writes fields synodic's config forbids


def _family(raw: dict, where: Path):
    mt = raw.get("model_type")
    if mt == "nemotron_h":
        from . import nemotron_h as fam
    elif mt in ("qwen3_next", "qwen3_5", "qwen3_5_text"):  # Qwen3.5: Qwen3-Next with split GDN projections
        from . import qwen3_next as fam
    else:
        raise CheckpointError(f"{where}: model_type={mt!r}; expected one of {', '.join(FAMILIES)} (the Hugging Face "
                              "architectures synodic loads)")
    return fam


def _mapping(d: Path):
    where = d / "config.json"
    require(where.is_file(), f"{d} has no config.json; expected a Hugging Face checkpoint folder (config.json + "
                             "safetensors shards)")
    raw = read_json(where, "a Hugging Face model config")
    fam = _family(raw, where)
    keys = {k for h in shards(d).values() for k in h}
    return fam.mapping(raw, where, keys)


def hf_config(d: str | Path):
    return _mapping(Path(d)).config


def hf_plan(d: str | Path) -> Plan:
    d = Path(d)
    p = plan(d, _mapping(d))
    _check_tokenizer(d, p.mapping.config.vocab_size)
    return p


def load_hf(d: str | Path, device="cpu", dtype=torch.float32, progress: bool = True):
    """The folder's model on `device` in `dtype`; every check runs before anything is allocated there."""
    return materialize(hf_plan(d), device, dtype, progress)


def hf_problems(d: str | Path) -> list[str]:
    try:
        hf_plan(d)
    except CheckpointError as e:
        return e.lines
    return []


def _check_tokenizer(d: Path, vocab: int) -> None:
    tj = d / "tokenizer.json"
    require(not tj.is_dir(), f"{tj} is a directory; expected a Hugging Face tokenizers file (or none: raw bytes)")
    _check_eos(d, vocab)
    if not tj.is_file():
        return
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tj))
    except Exception as e:  # tokenizers raises its own Exception subclass on any bad file
        raise CheckpointError(f"{tj} is not a tokenizer ({str(e).splitlines()[0][:80]}); expected a Hugging Face "
                              "tokenizers file") from None
    n = tok.get_vocab_size(with_added_tokens=True)
    require(n <= vocab, f"{tj} has {n} tokens; expected at most vocab_size={vocab} (config.json: the embedding's "
                        "rows)")


def _eos_values(d: Path):
    """(file, its eos_token_id values as a list) for generation_config.json then config.json, where present."""
    for name in ("generation_config.json", "config.json"):
        p = d / name
        if p.is_file():
            v = read_json(p, "a JSON object").get("eos_token_id")
            yield p, (v if isinstance(v, list) else [v])


def _check_eos(d: Path, vocab: int) -> None:
    """An EOS id from generation_config.json / config.json must be a token of the model: outside the vocabulary,
    generation would never stop at it."""
    for p, values in _eos_values(d):
        for x in values:
            if isinstance(x, int) and not isinstance(x, bool):
                require(0 <= x < vocab, f"{p}: eos_token_id={x}; expected a token id below vocab_size={vocab}")


def eos_id(d: str | Path, tok) -> int | None:
    """EOS: generation_config.json's eos_token_id, else config.json's, else tokenizer_config.json's eos_token
    (a list of ids: the first)."""
    d = Path(d)
    for _, values in _eos_values(d):
        v = values[0] if values else None
        if isinstance(v, int):
            return v
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        v = read_json(tc, "a tokenizer config").get("eos_token")
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            return tok.token_to_id(v)
    return None


def hf_codec(d: str | Path):
    from synodic.engine.text import TokenizerCodec
    codec = TokenizerCodec(Path(d) / "tokenizer.json")
    eos = eos_id(d, codec.tok)
    if eos is not None:
        codec.eos_id = eos
    return codec
