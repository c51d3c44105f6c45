"""DSA-class presets: every layer attention (+ MLP), KV rows shaped like MLA's.

An MLA layer caches one 576-value row per token (512 latent + 64 RoPE dims, 1152 B in bf16). Our
attention is GQA with separate K and V, so these presets use one KV head of head_dim 288: K and V
together are 576 values per token per layer — the same row size, the same bytes per selected row,
the same host-pool and hot-buffer geometry — while the math stays ordinary multi-query attention.
Top-k selection comes from the KV policy (`kv.top_k`, training-free indexer over the keys); the
presets carry no learned indexer.

Register with, at the end of synodic/models/presets.py:

    from .presets_dsa import DSA_PRESETS
    PRESETS.update(DSA_PRESETS)

plus conf/model/tiny_dsa.yaml and conf/model/dsa_mla_7b.yaml (kind: <name>, weights: random,
dtype, seed, overrides: {} — like the other model options).
"""
from .config import HybridConfig

DSA_PRESETS: dict[str, HybridConfig] = {
    # CPU-sized: 4 attention layers with 576-value rows.
    "tiny_dsa": HybridConfig(
        model_type="nemotron_h", vocab_size=4096, hidden_size=256, intermediate_size=512,
        num_hidden_layers=8, hybrid_override_pattern="*-*-*-*-", mlp_hidden_act="relu2",
        num_attention_heads=4, num_key_value_heads=1, head_dim=288, partial_rotary_factor=64 / 288,
        tie_word_embeddings=True),
    # GPU long-context benchmark shape: 30 attention layers, 32 query heads over one 576-value KV row per
    # token and layer (34.6 KB per token), ~6.4B parameters (13 GB bf16): at 100K context one request's
    # full KV is 3.5 GB, so a resident pool on one H200 refuses requests long before hisparse/adaptive do.
    "dsa_mla_7b": HybridConfig(
        model_type="nemotron_h", vocab_size=129280, hidden_size=4096, intermediate_size=11008,
        num_hidden_layers=60, hybrid_override_pattern="*-" * 30, mlp_hidden_act="silu",
        num_attention_heads=32, num_key_value_heads=1, head_dim=288, partial_rotary_factor=64 / 288,
        rope_theta=1e6),
}
