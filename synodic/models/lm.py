"""The hybrid decoder LM: embedding → layers of pre-norm residual blocks → norm → LM head."""
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import Attention
from .config import HybridConfig
from .gdn import GatedDeltaNetMixer
from .mamba2 import Mamba2Mixer
from .mlp import MLP
from .moe import SparseMoE
from .norm import RMSNorm


def indexer_last(named_params):
    """(name, parameter) pairs with the learned indexers' last (stable otherwise): the order random
    init draws in."""
    return sorted(named_params, key=lambda np: ".indexer." in np[0])


@dataclass
class PrefillContext:
    """Prompts of equal length, row i seeding slot slots[i]; positions start at `start`. The model returns
    only the last position's logits."""
    ssm: object
    kv: object
    slots: list[int]
    start: int = 0
    mode: str = "prefill"

    @property
    def slot(self) -> int:
        """The one slot of a single-sequence prefill (sparse prefill of the top-k KV policies)."""
        if len(self.slots) != 1:
            raise ValueError(f"PrefillContext.slots: sparse prefill takes one sequence per forward, got "
                             f"{len(self.slots)}")
        return self.slots[0]


@dataclass
class DecodeContext:
    """One token per sequence: row i is slot slot_ids[i] at position positions[i]. The backends hold
    the slot ids; tensors here are fixed-address so a step can be graph-captured."""
    ssm: object
    kv: object
    positions: torch.Tensor
    mode: str = "decode"
    rope: dict = field(default_factory=dict)  # the step's RoPE cos/sin (and window positions), shared by its layers


@dataclass
class VerifyContext:
    """A window of T tokens per sequence starting at positions[i] (speculative verification): the
    backends compute all T outputs without committing state; the runner commits accepted counts."""
    ssm: object
    kv: object
    positions: torch.Tensor
    mode: str = "verify"
    rope: dict = field(default_factory=dict)  # the step's RoPE cos/sin (and window positions), shared by its layers


class Block(nn.Module):
    """A pre-norm residual block, x + mixer(norm(x)); HybridLM.forward runs it inline so that the residual
    add is fused into the next block's norm."""

    def __init__(self, cfg: HybridConfig, kind: str, index: int):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer = {
            "mamba2": lambda: Mamba2Mixer(cfg, index),
            "gdn": lambda: GatedDeltaNetMixer(cfg, index),
            "attention": lambda: Attention(cfg, index),
            # `index`: the MLP ordinal the MoE rule reads (qwen3_next: the layer)
            "mlp": lambda: (SparseMoE.from_config(cfg) if cfg.moe_layer(index)
                            else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_hidden_act)),
        }[kind]()


class HybridLM(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        counters = {"mamba2": 0, "gdn": 0, "attention": 0, "mlp": 0}
        blocks = []
        for layer in cfg.blocks():
            for kind in layer:
                idx = counters["mamba2"] + counters["gdn"] if kind in ("mamba2", "gdn") else counters[kind]
                blocks.append(Block(cfg, kind, idx))
                counters[kind] += 1
        self.blocks = nn.ModuleList(blocks)
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def ssm_layers(self) -> list[nn.Module]:
        return [b.mixer for b in self.blocks if b.kind in ("mamba2", "gdn")]

    @property
    def attention_layers(self) -> list[nn.Module]:
        return [b.mixer for b in self.blocks if b.kind == "attention"]

    def init_weights(self, seed: int) -> "HybridLM":
        """Deterministic random init: N(0, initializer_range) for linears/embeddings, scaled down for
        residual output projections; mixer-specific parameters keep their constructors' init. Learned
        indexer weights are drawn last, so every other weight is the same with or without an indexer."""
        g = torch.Generator().manual_seed(seed)
        std = self.config.initializer_range
        n_res = len(self.blocks)
        for name, p in indexer_last(self.named_parameters()):
            if p.dim() < 2 or "conv1d" in name:
                continue
            s = std / (2 * n_res) ** 0.5 if name.endswith(("out_proj.weight", "o_proj.weight",
                                                             "down_proj.weight")) else std
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * s)
        return self

    def forward(self, input_ids: torch.Tensor, ctx=None, hidden_layers: tuple[int, ...] = ()):
        """input_ids [b,T] → logits [b,T,V] ([b,1,V] with a PrefillContext: only the last position's). With a
        Prefill/Decode/VerifyContext the SSM and attention layers read and write the run's state backend and KV
        policy. With `hidden_layers` (block indices) it returns (logits, hidden): hidden [b,T,n*H] is the residual
        stream right after each listed block (x + its mixer's output), concatenated in the listed order, for all
        T positions in every mode (the speculative drafter's context features)."""
        want = {i: j for j, i in enumerate(hidden_layers)}
        taps: list = [None] * len(hidden_layers)
        x = self.embed_tokens(input_ids)
        delta = None  # the last mixer's output, added to the residual stream by the next norm's kernel
        for i, blk in enumerate(self.blocks):
            if delta is None:
                h = blk.norm(x)
            else:
                x, h = blk.norm.add(x, delta)
            delta = blk.mixer(h, ctx)
            if i in want:
                taps[want[i]] = x + delta
        hidden = torch.cat(taps, dim=-1) if hidden_layers else None
        if ctx is not None and ctx.mode == "prefill":  # a prompt needs its last logits only (V x T of them)
            x, delta = x[:, -1:], None if delta is None else delta[:, -1:]
        if delta is None:
            logits = self.lm_head(self.norm_f(x))
        else:
            logits = self.lm_head(self.norm_f.add(x, delta)[1])
        return logits if hidden is None else (logits, hidden)
