"""Text corpus: documents from the Python standard library (or the user's files), a deterministic
split into train and held-out by document, and packing of token streams into fixed-length sequences.

Why the stdlib: every machine with Python has it, with no download; it is ~30 MB of real,
varied text (code, comments, docstrings, pydoc's topic help) written by many authors; it is
deterministic given the Python version. A document is one file. Which documents are held out is
decided by a hash of the file's path relative to the corpus root, so the same modules are held out
on every machine and Python version; the held-out shard the repo ships (assets/corpus/heldout.txt)
makes evaluation identical everywhere even where the local stdlib differs.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

EOT = "<|endoftext|>"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
HELDOUT_PATH = ASSETS / "corpus" / "heldout.txt"
HELDOUT_FRACTION = 0.06          # share of documents (by path hash) held out of training
HELDOUT_MAX_BYTES = 2_000_000    # the shipped shard stays under this
MAX_DOC_BYTES = 1_000_000        # bigger files are generated data, not text
_SKIP_DIRS = {"site-packages", "__pycache__", "lib-dynload", "dist-packages"}
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


@dataclass(frozen=True)
class Document:
    name: str   # path relative to the corpus root, '/'-separated
    text: str


@dataclass(frozen=True)
class Corpus:
    root: str
    train: list[Document]
    heldout: list[Document]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for d in self.train:
            h.update(d.name.encode() + b"\0" + d.text.encode() + b"\0")
        return h.hexdigest()[:16]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(name: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """A document is held out when the hash of its relative path falls under `fraction`."""
    h = int.from_bytes(hashlib.sha256(f"synodic-corpus:{name}".encode()).digest()[:8], "big")
    return h < fraction * 2 ** 64


def _read(path: Path) -> str | None:
    raw = path.read_bytes()
    if len(raw) > MAX_DOC_BYTES or b"\0" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if EOT in text or not text.strip():
        return None
    return text


def list_documents(root: str | Path, suffixes=TEXT_SUFFIXES) -> list[Document]:
    """Every readable UTF-8 text file under `root` (one document each), sorted by relative path."""
    root = Path(root)
    if root.is_file():
        text = _read(root)
        return [Document(root.name, text)] if text is not None else []
    docs = []
    for p in sorted(root.rglob("*"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root)
        if (not p.is_file() or p.suffix not in suffixes or set(rel.parts[:-1]) & _SKIP_DIRS
                or rel.parts[0].startswith("config-")):
            continue
        text = _read(p)
        if text is not None:
            docs.append(Document(rel.as_posix(), text))
    return docs


def build_corpus(paths: list[str | Path] | None = None, fraction: float = HELDOUT_FRACTION) -> Corpus:
    """Documents of the stdlib (paths None: `.py` files only) or of the user's files/folders, split
    by document into train and held-out."""
    if paths:
        docs = [d for p in paths for d in list_documents(p)]
        root = ":".join(str(p) for p in paths)
    else:
        root = str(stdlib_root())
        docs = list_documents(root, suffixes=(".py",))
    train = [d for d in docs if not is_heldout(d.name, fraction)]
    held = [d for d in docs if is_heldout(d.name, fraction)]
    if not held and len(train) > 1:   # a small user corpus: hold out its last document
        held = [train.pop()]
    return Corpus(root, train, held)


def heldout_shard(docs: list[Document], max_bytes: int = HELDOUT_MAX_BYTES) -> str:
    """Held-out documents in order, each followed by EOT, as long as the text stays under max_bytes."""
    parts, n = [], 0
    for d in docs:
        piece = d.text + EOT
        size = len(piece.encode())
        if n + size > max_bytes:
            continue
        parts.append(piece)
        n += size
    return "".join(parts)


def load_heldout(path: str | Path = HELDOUT_PATH) -> str:
    return Path(path).read_text(encoding="utf-8")


def heldout_tokens(encode, n: int) -> list[int]:
    """The first n tokens of the held-out text under `encode` (text -> ids), tokenizing only what they need."""
    text = load_heldout()
    ids: list[int] = []
    chunk = max(4096, 16 * n)  # characters per read: a token is a few characters
    for start in range(0, len(text), chunk):
        ids += encode(text[start:start + chunk])
        if len(ids) >= n:
            return ids[:n]
    raise ValueError(f"the held-out text has {len(ids)} tokens, {n} needed")


# ---------------------------------------------------------------------------------------- packing
def pack(token_docs, eot_id: int) -> torch.Tensor:
    """Token lists of documents → one int32 stream, each document followed by EOT."""
    flat = []
    for ids in token_docs:
        flat.extend(ids)
        flat.append(eot_id)
    return torch.tensor(flat, dtype=torch.int32)


def num_windows(stream_len: int, seq_len: int) -> int:
    """Non-overlapping windows of seq_len inputs (+1 target token shared with the next window)."""
    return max(0, (stream_len - 1) // seq_len)


def windows(stream: torch.Tensor, seq_len: int, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of the packed sequences: [len(index), seq_len + 1] (inputs = [:, :-1], targets =
    [:, 1:])."""
    offs = index.to(stream.device)[:, None] * seq_len + torch.arange(seq_len + 1, device=stream.device)
    return stream[offs].long()


class PackedSampler:
    """Deterministic batches of packed sequences: each epoch visits every window once, in an order
    drawn from (seed, epoch). The position (epoch, cursor) is all it needs to resume."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed
        self.n = num_windows(len(stream), seq_len)
        if self.n < batch_size:
            raise ValueError(f"corpus has {self.n} windows of {seq_len} tokens: expected at least "
                             f"batch_size={batch_size}")
        self.epoch, self.cursor = 0, 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def next(self) -> torch.Tensor:
        if self.cursor + self.batch_size > self.n:   # drop the ragged end of an epoch
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._perm(self.epoch)
        idx = self._order[self.cursor:self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return windows(self.stream, self.seq_len, idx)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.cursor = int(s["epoch"]), int(s["cursor"])
        self._order = self._perm(self.epoch)
