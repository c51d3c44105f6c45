"""DSA-class presets: every layer attention (+ MLP), KV rows shaped like MLA's.

An MLA layer caches one 576-value row per token (512 latent + 64 RoPE dims, 1152 B in bf16). Our
attention is GQA with separate K and V, so these presets use one KV head of head_dim 288: K and V
together are 576 values per token per layer — the same row size, the same bytes per selected row,
the same host-pool and hot-buffer geometry — while the math stays ordinary multi-query attention.
Both presets carry a learned DSA indexer in every attention layer (`index_n_heads` query heads of
`index_head_dim` dims, RoPE on the leading `index_rope_dim`; synodic/models/indexer.py): with
`kv.top_k` > 0 (or kv=hisparse / adaptive) the KV policy caches its keys k_I (`kv.learned_key_dtype`,
fp8 + per-token scale by default: 36 B per token and layer on tiny_dsa, DSA's 132 B on dsa_mla_7b) and
selects by its scores (`kv.indexer=auto`, or `learned`); `kv.indexer=bf16|fp8` selects with the
training-free indexer over the model's keys instead, on the same model. `+model.overrides.index_n_heads=0`
drops the indexer; every other weight of a random init stays the same (indexer weights are drawn last).
The indexer is random like the rest: no pipeline trains it yet.

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
        tie_word_embeddings=True, index_n_heads=4, index_head_dim=32, index_rope_dim=16),
    # GPU long-context benchmark shape: 30 attention layers, 32 query heads over one 576-value KV row per
    # token and layer (34.6 KB per token), ~6.4B parameters (13 GB bf16): at 100K context one request's
    # full KV is 3.5 GB, so a resident pool on one H200 refuses requests long before hisparse/adaptive do.
    # DSA's indexer (64 heads x 128 dims) adds 1.03B parameters (2 GB bf16): its q projection reads the
    # hidden state at full rank (DSA reads MLA's 1536-wide query latent, which this model does not have).
    "dsa_mla_7b": HybridConfig(
        model_type="nemotron_h", vocab_size=129280, hidden_size=4096, intermediate_size=11008,
        num_hidden_layers=60, hybrid_override_pattern="*-" * 30, mlp_hidden_act="silu",
        num_attention_heads=32, num_key_value_heads=1, head_dim=288, partial_rotary_factor=64 / 288,
        rope_theta=1e6, index_n_heads=64, index_head_dim=128, index_rope_dim=64),
}
