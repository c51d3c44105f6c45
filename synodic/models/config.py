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
    # nemotron_h layout: 'M' Mamba-2, '*' attention, '-' MLP, 'E' MoE MLP; one char per layer.
    hybrid_override_pattern: str | None = Field(None, description="NemotronH layer pattern (M, *, -, E).")
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
    # sparse MoE MLPs (synodic/models/moe.py): qwen3_next's layers by decoder_sparse_step / mlp_only_layers,
    # nemotron_h's 'E' layers; num_experts 0 = dense MLPs everywhere. Experts use mlp_hidden_act (silu: gated
    # SwiGLU, relu2: non-gated squared ReLU).
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE MLP (0 = no MoE).")
    num_experts_per_tok: int = Field(1, ge=1, description="Experts each token is routed to (top-k).")
    moe_intermediate_size: int = Field(0, ge=0, description="Hidden width of one routed expert.")
    shared_expert_intermediate_size: int = Field(0, ge=0, description="Hidden width of the shared expert "
                                                 "(0 = none).")
    norm_topk_prob: bool = Field(True, description="Renormalise the top-k router weights to sum to 1.")
    decoder_sparse_step: int = Field(1, ge=1, description="Layer i's MLP is MoE when (i + 1) % step == 0 ...")
    mlp_only_layers: list[int] = Field(default_factory=list, description="... and i is not listed here.")
    moe_router: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="softmax: top-k of the softmax (Qwen3-Next); sigmoid: fp32 sigmoid scores, chosen "
        "with a score-correction bias among the best topk_group of n_group groups (NemotronH / DeepSeek-V3).")
    n_group: int = Field(1, ge=1, description="Sigmoid router: expert groups.")
    topk_group: int = Field(1, ge=1, description="Sigmoid router: groups a token's experts are chosen from.")
    routed_scaling_factor: float = Field(1.0, gt=0, description="Sigmoid router: factor on the routed weights.")
    shared_expert_gate: bool = Field(True, description="Shared expert scaled by sigmoid(shared_expert_gate(x)) "
                                     "(Qwen3-Next); false: added as it is (NemotronH).")
    moe_latent_size: int = Field(0, ge=0, description="Routed experts work in this width between fc1 / fc2 latent "
                                 "projections (NemotronH moe_latent_size; 0 = hidden_size, no projections).")
    initializer_range: float = Field(0.02, gt=0, description="Std of random init.")

    @model_validator(mode="after")
    def _layout(self) -> HybridConfig:
        if self.model_type == "nemotron_h":
            p = self.hybrid_override_pattern
            if p is None or len(p) != self.num_hidden_layers or set(p) - set("M*-E"):
                raise ValueError(f"hybrid_override_pattern={p!r}: expected {self.num_hidden_layers} "
                                 "chars from 'M', '*', '-', 'E'")
            if ("E" in p) != bool(self.num_experts):
                raise ValueError(f"hybrid_override_pattern={p!r} with num_experts={self.num_experts}: expected "
                                 "num_experts >= 1 exactly when the pattern has MoE ('E') layers")
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
            E, G = self.num_experts, self.n_group
            if self.moe_router == "softmax" and (G, self.topk_group, self.routed_scaling_factor) != (1, 1, 1.0):
                raise ValueError(f"n_group={G}, topk_group={self.topk_group}, routed_scaling_factor="
                                 f"{self.routed_scaling_factor} with moe_router=softmax: expected 1, 1, 1.0 (grouped "
                                 "choice and scaling belong to the sigmoid router)")
            if G > 1 and (E % G or E // G < 2 or self.topk_group > G
                          or self.num_experts_per_tok > self.topk_group * (E // G)):
                raise ValueError(f"n_group={G}, topk_group={self.topk_group}: expected n_group to divide "
                                 f"num_experts={E} into groups of >= 2, topk_group <= n_group and top-k "
                                 f"{self.num_experts_per_tok} <= topk_group * group size")
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
            m = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "mlp"}
            return [[m[c]] for c in self.hybrid_override_pattern]
        mixer = {"linear_attention": "gdn", "full_attention": "attention"}
        return [[mixer[t], "mlp"] for t in self.layer_types]

    def moe_layer(self, mlp: int) -> bool:
        """Whether the `mlp`-th MLP block is the sparse MoE block: qwen3_next (one MLP per layer, so `mlp` is
        the layer) by transformers' rule, nemotron_h when that MLP's pattern char is 'E'."""
        if not self.num_experts:
            return False
        if self.model_type == "nemotron_h":
            return [c for c in self.hybrid_override_pattern if c in "-E"][mlp] == "E"
        return mlp not in self.mlp_only_layers and (mlp + 1) % self.decoder_sparse_step == 0

    def count(self, kind: BlockKind) -> int:
        return sum(b.count(kind) for b in self.blocks())
