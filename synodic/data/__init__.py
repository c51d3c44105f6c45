"""Corpus (stdlib or user text), byte-level BPE tokenizer, packing into fixed-length sequences."""
from .corpus import EOT, Corpus, Document, PackedSampler, build_corpus, load_heldout, pack
from .tokenizer import TextTokenizer, load_tokenizer, train_tokenizer

__all__ = ["EOT", "Corpus", "Document", "PackedSampler", "build_corpus", "load_heldout", "pack",
           "TextTokenizer", "load_tokenizer", "train_tokenizer"]
