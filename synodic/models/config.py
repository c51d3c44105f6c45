"""Architecture config of a hybrid decoder LM.

Field names follow Hugging Face's configs — NemotronH (`hybrid_override_pattern`, `mamba_*`,
`ssm_state_size`, `n_groups`) for Mamba-2 hybrids and Qwen3-Next (`layer_types`, `linear_*`) for
Gated DeltaNet hybrids — so loading a real checkpoint later is a key mapping, not a redesign.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

BlockKind = Literal["mamba2", "gdn", "attention", "mlp"]


class HybridConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_type: Literal["nemotron_h", "qwen3_next"] = Field(
        description="nemotron_h: one block per layer from hybrid_override_pattern; "
        "qwen3_next: each layer is a mixer (layer_types) followed by a SwiGLU MLP")
    vocab_size: int = Field(ge=2, description="Vocabulary size (embedding rows).")
    hidden_size: int = Field(ge=1, description="Residual stream width.")
    intermediate_size: int = Field(ge=1, description="MLP hidden width.")
    num_hidden_layers: int = Field(ge=1, description="Number of layers.")
    tie_word_embeddings: bool = Field(False, description="LM head shares the embedding matrix.")
    rms_norm_eps: float = Field(1e-5, gt=0, description="RMSNorm epsilon.")
    mlp_hidden_act: Literal["relu2", "silu"] = Field(
        "silu", description="relu2: squared-ReLU MLP (NemotronH); silu: SwiGLU (gate*up).")
    # nemotron_h layout: 'M' Mamba-2, '*' attention, '-' MLP; one char per layer.
    hybrid_override_pattern: str | None = Field(None, description="NemotronH layer pattern (M, *, -).")
    # qwen3_next layout
    layer_types: list[Literal["linear_attention", "full_attention"]] | None = Field(
        None, description="Qwen3-Next mixer per layer.")
    # attention
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(2, ge=1, description="KV heads (GQA).")
    head_dim: int = Field(32, ge=2, description="Attention head dim.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base.")
    partial_rotary_factor: float = Field(1.0, ge=0, le=1, description="Fraction of head_dim rotated "
                                         "(0: attention without rotary embeddings, as NemotronH's).")
    qk_norm: bool = Field(False, description="RMSNorm on q and k per head before RoPE.")
    attn_output_gate: bool = Field(False, description="Attention output times sigmoid(o_gate(x)) before o_proj "
                                   "(Qwen3-Next's gated attention; o_gate is its own projection).")
    # learned top-k indexer (DeepSeek-V3.2 DSA "lightning indexer"), one per attention layer
    index_n_heads: int = Field(0, ge=0, description="Learned indexer query heads H_I per attention layer "
                               "(synodic/models/indexer.py); 0 = no learned indexer (top-k KV policies then "
                               "use the training-free one).")
    index_head_dim: int = Field(128, ge=2, description="Learned indexer head dim d_I (of its queries and of "
                                "its one shared key per token, the key the KV policy caches).")
    index_rope_dim: int = Field(64, ge=0, description="Leading learned-indexer dims rotated by RoPE "
                                "(rope_theta), even, <= index_head_dim; 0 = position-free index scores.")
    # Mamba-2
    mamba_num_heads: int = Field(8, ge=1, description="Mamba-2 heads H.")
    mamba_head_dim: int = Field(16, ge=1, description="Mamba-2 head dim P.")
    ssm_state_size: int = Field(16, ge=1, description="Mamba-2 state size N.")
    n_groups: int = Field(1, ge=1, description="Mamba-2 B/C groups G.")
    conv_kernel: int = Field(4, ge=1, description="Mamba-2 causal conv width.")
    chunk_size: int = Field(64, ge=1, description="SSD chunk length for prefill/training.")
    # Gated DeltaNet
    linear_num_value_heads: int = Field(4, ge=1, description="GDN value heads HV.")
    linear_num_key_heads: int = Field(2, ge=1, description="GDN key heads Hk.")
    linear_key_head_dim: int = Field(32, ge=1, description="GDN K.")
    linear_value_head_dim: int = Field(32, ge=1, description="GDN V.")
    linear_conv_kernel_dim: int = Field(4, ge=1, description="GDN causal conv width.")
    gdn_norm_before_gate: bool = Field(False, description="GDN output norm: false = norm(y * silu(z)) (the "
                                       "Mamba-2 order); true = norm(y) * silu(z) (Qwen3-Next's order).")
    # sparse MoE MLPs (Qwen3-Next's block, synodic/models/moe.py); num_experts 0 = dense MLPs everywhere
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE MLP (qwen3_next; 0 = no MoE).")
    num_experts_per_tok: int = Field(1, ge=1, description="Experts each token is routed to (top-k).")
    moe_intermediate_size: int = Field(0, ge=0, description="Hidden width of one routed expert.")
    shared_expert_intermediate_size: int = Field(0, ge=0, description="Hidden width of the shared expert "
                                                 "(0 = none).")
    norm_topk_prob: bool = Field(True, description="Renormalise the top-k router weights to sum to 1.")
    decoder_sparse_step: int = Field(1, ge=1, description="Layer i's MLP is MoE when (i + 1) % step == 0 ...")
    mlp_only_layers: list[int] = Field(default_factory=list, description="... and i is not listed here.")
    initializer_range: float = Field(0.02, gt=0, description="Std of random init.")

    @model_validator(mode="after")
    def _layout(self) -> HybridConfig:
        if self.model_type == "nemotron_h":
            p = self.hybrid_override_pattern
            if p is None or len(p) != self.num_hidden_layers or set(p) - set("M*-"):
                raise ValueError(f"hybrid_override_pattern={p!r}: expected {self.num_hidden_layers} "
                                 "chars from 'M', '*', '-'")
            if self.mamba_num_heads % self.n_groups:
                raise ValueError(f"mamba_num_heads={self.mamba_num_heads}: expected a multiple of "
                                 f"n_groups={self.n_groups}")
        else:
            t = self.layer_types
            if t is None or len(t) != self.num_hidden_layers:
                raise ValueError(f"layer_types: expected a list of {self.num_hidden_layers} entries")
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ValueError(f"linear_num_value_heads={self.linear_num_value_heads}: expected a "
                                 f"multiple of linear_num_key_heads={self.linear_num_key_heads}")
        if self.num_experts:
            if self.model_type != "qwen3_next":
                raise ValueError(f"num_experts={self.num_experts}: MoE MLPs are implemented for model_type "
                                 "qwen3_next; expected num_experts=0")
            if self.num_experts_per_tok > self.num_experts or not self.moe_intermediate_size:
                raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok}, moe_intermediate_size="
                                 f"{self.moe_intermediate_size}: expected top-k <= num_experts={self.num_experts} "
                                 "and moe_intermediate_size >= 1")
        if self.index_n_heads and (self.index_rope_dim % 2 or self.index_rope_dim > self.index_head_dim):
            raise ValueError(f"index_rope_dim={self.index_rope_dim}: expected an even number <= "
                             f"index_head_dim={self.index_head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads}: expected a multiple "
                             f"of num_key_value_heads={self.num_key_value_heads}")
        return self

    def blocks(self) -> list[list[BlockKind]]:
        """Per layer, the residual sub-blocks in order."""
        if self.model_type == "nemotron_h":
            m = {"M": "mamba2", "*": "attention", "-": "mlp"}
            return [[m[c]] for c in self.hybrid_override_pattern]
        mixer = {"linear_attention": "gdn", "full_attention": "attention"}
        return [[mixer[t], "mlp"] for t in self.layer_types]

    def moe_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the sparse MoE block (transformers' Qwen3-Next rule)."""
        return (bool(self.num_experts) and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def count(self, kind: BlockKind) -> int:
        return sum(b.count(kind) for b in self.blocks())
