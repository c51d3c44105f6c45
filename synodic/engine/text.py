"""Prompt encoding and output decoding: the checkpoint's tokenizer.json, or raw UTF-8 bytes when a
model ships without one (random-weight presets)."""
from pathlib import Path


class ByteCodec:
    eos_id = None
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class TokenizerCodec:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(str(path))
        self.name = str(path)
        self.eos_id = next((self.tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "<eos>")
                            if self.tok.token_to_id(t) is not None), None)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def load_codec(ckpt_dir: Path | None):
    if ckpt_dir is not None and (Path(ckpt_dir) / "tokenizer.json").is_file():
        from synodic.models.hf import hf_codec, is_hf_folder
        if is_hf_folder(ckpt_dir):  # EOS from generation_config.json / tokenizer_config.json
            return hf_codec(ckpt_dir)
        return TokenizerCodec(Path(ckpt_dir) / "tokenizer.json")
    return ByteCodec()
