"""DraftConfig: the shape and scheme of a drafter (saved as its config.json)."""
from typing import Literal

from pydantic import BaseModel, Field

SCHEMES = ("dflash", "dspark", "dflash2")


def default_target_layers(num_blocks: int, n: int = 3) -> tuple[int, ...]:
    """n evenly spaced target blocks from block 1 to the last one. The tiny targets are shallow, so the last
    block (whose residual stream nearly fixes the next token) is kept, unlike the 1 + i(L-4)/(n-1) spacing of
    deep targets."""
    if num_blocks <= n:
        return tuple(range(num_blocks))
    first, last = min(1, num_blocks - 1), num_blocks - 1
    return tuple(sorted({round(first + i * (last - first) / (n - 1)) for i in range(n)}))


class DraftConfig(BaseModel):
    scheme: Literal["dflash", "dspark", "dflash2"] = Field(description="Which drafter this is.")
    vocab_size: int = Field(ge=1, description="The target's vocabulary (its embedding and LM head are shared).")
    hidden_size: int = Field(ge=1, description="The target's hidden size (also the drafter's).")
    target_layers: tuple[int, ...] = Field(description="Target block indices whose residual streams form the context.")
    target_kind: str | None = Field(default=None, description="The target preset it was trained for (informational).")
    gamma: int = Field(default=7, ge=1, description="Drafts per block it was trained for.")
    num_layers: int = Field(default=2, ge=1, description="Draft decoder layers.")
    num_heads: int = Field(default=6, ge=1, description="Query heads.")
    num_kv_heads: int = Field(default=2, ge=1, description="K/V heads (grouped-query attention).")
    head_dim: int = Field(default=64, ge=2, description="Head width (even: full RoPE over it).")
    intermediate_size: int = Field(default=1024, ge=1, description="SwiGLU MLP width.")
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base over absolute positions.")
    rms_norm_eps: float = Field(default=1e-6, gt=0, description="RMSNorm epsilon.")
    markov_rank: int = Field(default=256, ge=1, description="DSpark: rank r of the Markov head (W1 V x r, W2 r -> V).")
    selector_k: int = Field(default=16, ge=1, description="DFlash2: candidates kept per position (LM-head top-K).")
    selector_rank: int = Field(default=256, ge=1, description="DFlash2: rank r of the path selector's codebooks.")
    conv_group: int = Field(default=16, ge=1, description="DFlash2: channels sharing one dynamic kernel scalar.")
    conv_taps: int = Field(default=2, ge=1, description="DFlash2: taps of the dynamic causal convolution.")
    lookup_hint: int = Field(default=0, ge=0, description="Prompt-lookup hints at the mask slots: the longest "
                             "context suffix matched (tokens; synodic/spec/models/lookup.py); 0 = none.")
    seed: int = Field(default=0, description="Seed of the random init.")
