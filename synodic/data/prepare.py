"""Corpus → tokenizer + packed train stream + held-out text, cached on disk by content key.

The cache (env SYNODIC_CACHE, default ~/.cache/synodic) holds `train.bin` (uint16 token stream,
documents separated by EOT), `tokenizer.json` and `meta.json`; a second run reads it in a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .corpus import HELDOUT_PATH, build_corpus, heldout_shard, load_heldout, pack
from .tokenizer import SHIPPED_TOKENIZER, TextTokenizer, load_tokenizer, train_tokenizer


@dataclass
class Prepared:
    tokenizer: TextTokenizer
    tokenizer_path: Path
    train: torch.Tensor        # int32 [n] packed train stream
    heldout_text: str
    info: dict


def cache_root() -> Path:
    """The token cache's root: $SYNODIC_CACHE or ~/.cache/synodic; a file there is refused in one line."""
    env = os.environ.get("SYNODIC_CACHE")
    root = Path(env or Path.home() / ".cache" / "synodic")
    bad = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if bad is not None:
        from synodic.config.errors import ConfigError
        key = f"SYNODIC_CACHE={env!r}" if env else f"the token cache ({root})"
        raise ConfigError([f"{key}: {bad} is a file; expected a directory (or nothing) there"])
    return root


def _key(data: list[str], tokenizer: str, vocab_size: int) -> str:
    h = hashlib.sha256()
    if data:
        for p in data:
            for f in sorted(Path(p).rglob("*")) if Path(p).is_dir() else [Path(p)]:
                if f.is_file():
                    st = f.stat()
                    h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    else:
        h.update(f"stdlib:{sys.version_info[:3]}:{sys.platform}".encode())
    if tokenizer == "train":
        h.update(f"train:{vocab_size}".encode())
    else:
        tp = SHIPPED_TOKENIZER if tokenizer == "shipped" else Path(tokenizer)
        h.update(hashlib.sha256(tp.read_bytes()).digest())
    return h.hexdigest()[:16]


def prepare(data: list[str] | None = None, tokenizer: str = "shipped", vocab_size: int = 4096,
            cache: str | Path | None = None, log=print) -> Prepared:
    data = list(data or [])
    if len(data) == 1 and (Path(data[0]) / "meta.json").is_file() and (Path(data[0]) / "train.bin").is_file():
        d = Path(data[0])   # an already prepared corpus folder (e.g. carried to another machine)
    else:
        d = Path(cache or cache_root()) / f"corpus-{_key(data, tokenizer, vocab_size)}"
    meta_f = d / "meta.json"
    if meta_f.is_file():
        info = json.loads(meta_f.read_text())
        tok = load_tokenizer(d / "tokenizer.json")
        train = torch.from_numpy(np.fromfile(d / "train.bin", dtype=np.uint16).astype(np.int32))
        held = (d / "heldout.txt").read_text(encoding="utf-8") if (d / "heldout.txt").is_file() \
            else load_heldout()
        return Prepared(tok, d / "tokenizer.json", train, held, info)

    log(f"building corpus ({'stdlib' if not data else ', '.join(data)}) → {d}")
    corpus = build_corpus(data or None)
    if not corpus.train:
        raise ValueError(f"no train documents under {data}: expected UTF-8 text files")
    texts = [doc.text for doc in corpus.train]
    if tokenizer == "train":
        tok = train_tokenizer(texts, vocab_size)
    else:
        tok = load_tokenizer(SHIPPED_TOKENIZER if tokenizer == "shipped" else tokenizer)
    if tok.vocab_size > 65535:
        raise ValueError(f"tokenizer vocab {tok.vocab_size}: expected at most 65535 (uint16 cache)")
    stream = pack(tok.encode_batch(texts), tok.eot_id)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(d / "tokenizer.json")
    stream.numpy().astype(np.uint16).tofile(d / "train.bin")
    if data:
        held = heldout_shard(corpus.heldout)
        if not held:
            raise ValueError(f"no held-out document under {data}: expected at least two documents")
        (d / "heldout.txt").write_text(held, encoding="utf-8")
        held_src = "heldout.txt"
    else:
        held = load_heldout()   # the shipped shard: identical on every machine
        held_src = "shipped:" + HELDOUT_PATH.name
    info = {"source": corpus.root, "python": sys.version.split()[0], "fingerprint": corpus.fingerprint(),
            "train_documents": len(corpus.train), "heldout_documents": len(corpus.heldout),
            "train_bytes": sum(len(t.encode()) for t in texts), "train_tokens": int(len(stream)),
            "heldout_source": held_src, "heldout_bytes": len(held.encode()),
            "vocab_size": tok.vocab_size}
    meta_f.write_text(json.dumps(info, indent=2))
    return Prepared(tok, d / "tokenizer.json", stream, held, info)
