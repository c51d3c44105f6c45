"""Byte-level BPE (Hugging Face `tokenizers`): trained on the corpus, saved as tokenizer.json beside a
model. Byte-level means every string round-trips exactly; `<|endoftext|>` (id 0) ends documents."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .corpus import EOT

SHIPPED_TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "corpus" / "tokenizer.json"


class TextTokenizer:
    """Thin wrapper: encode(str) -> list[int], decode(list[int]) -> str, eot_id, vocab_size."""

    def __init__(self, tok: Tokenizer):
        self.raw = tok
        self.eot_id = tok.token_to_id(EOT)
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.raw.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.raw.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.raw.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> list[int]:
        """UTF-8 bytes each token id stands for (byte-level BPE: exact, so a token prefix's bytes are
        the sum over its ids even where a token splits a multi-byte character)."""
        if getattr(self, "_tb", None) is None:
            dec = _byte_decoder()
            special = {t.content for t in self.raw.get_added_tokens_decoder().values()}
            out = []
            for i in range(self.vocab_size):
                t = self.raw.id_to_token(i)
                out.append(len(t.encode()) if t in special or any(c not in dec for c in t) else len(t))
            self._tb = out
        return self._tb

    def save(self, path: str | Path) -> None:
        self.raw.save(str(path))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte ↔ printable-character map used by the ByteLevel pre-tokenizer (inverse)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> TextTokenizer:
    """Byte-level BPE over `texts` (deterministic for a given text order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return TextTokenizer(tok)


def load_tokenizer(path: str | Path = SHIPPED_TOKENIZER) -> TextTokenizer:
    """tokenizer.json file, or a checkpoint folder holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    return TextTokenizer(Tokenizer.from_file(str(p)))
