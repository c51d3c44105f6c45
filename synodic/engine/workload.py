"""`workload` group: what requests a run serves."""
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from synodic.config.registry import Component, register

ASSETS = Path(__file__).resolve().parent.parent / "assets"


class _Sampling(Component):
    temperature: float = Field(0.0, ge=0, description="0 = greedy; else softmax temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    seed: int = Field(0, description="base seed; request i samples with seed + i")


@register("workload")
class PromptsWorkload(_Sampling):
    """Prompts from a text file, one per line (default: the prompts shipped in the repo)."""
    kind: Literal["default"] = "default"
    path: str | None = Field(None, description="text file, one prompt per line; null: the shipped prompts")
    max_tokens: int = Field(48, ge=1, description="tokens generated per request")
    concurrency: int = Field(64, ge=1, description="requests in flight at once (capped by slots)")
    stop_at_eos: bool = Field(True, description="finish a request at the tokenizer's end token")

    @field_validator("path")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        from synodic.config.files import text_problem
        why = None if v is None else text_problem(v, "a UTF-8 text file with one prompt per line")
        if why:
            raise ValueError(why)
        return v


@register("workload")
class SyntheticWorkload(_Sampling):
    """Random-token prompts of a fixed length: `chat` (short) and `long` (long context) defaults."""
    kind: Literal["chat", "long"]
    num_requests: int = Field(16, ge=1, description="requests in the run")
    prompt_len: int = Field(128, ge=1, description="prompt tokens per request")
    output_len: int = Field(128, ge=1, description="generated tokens per request (no early stop)")
    concurrency: int = Field(16, ge=1, description="requests in flight at once (capped by slots)")


def build_requests(wl, codec, vocab_size: int):
    """Workload config → engine requests (prompt token ids + sampling params)."""
    import torch

    from .request import Request, SamplingParams

    def params(i: int, max_tokens: int, stop=()):
        return SamplingParams(temperature=wl.temperature, top_p=wl.top_p, seed=wl.seed + i,
                              max_tokens=max_tokens, stop_token_ids=tuple(stop))

    if wl.kind == "default":
        path = Path(wl.path) if wl.path else ASSETS / "prompts.txt"
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        stop = (codec.eos_id,) if wl.stop_at_eos and codec.eos_id is not None else ()
        return [Request(i, codec.encode(ln.replace("\\n", "\n")), params(i, wl.max_tokens, stop))
                for i, ln in enumerate(lines)]
    g = torch.Generator().manual_seed(wl.seed)
    return [Request(i, torch.randint(0, vocab_size, (wl.prompt_len,), generator=g).tolist(),
                    params(i, wl.output_len)) for i in range(wl.num_requests)]


def max_seq_len(wl, requests) -> int:
    out = wl.max_tokens if wl.kind == "default" else wl.output_len
    return max(len(r.prompt_ids) for r in requests) + out + 1
