"""Named architectures. Tiny presets decode on a 2-core CPU in seconds; real-shape presets carry
the layer shapes of production hybrids (random weights) for throughput work on the GPU."""
from .config import HybridConfig


def _nemotron_h_8b_pattern() -> str:
    # 52 layers: 24 Mamba-2, 4 attention, 24 MLP, attention spread through the stack (NemotronH-8B).
    p = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert len(p) == 52 and p.count("M") == 24 and p.count("*") == 4 and p.count("-") == 24
    return p


PRESETS: dict[str, HybridConfig] = {
    # Trained and shipped (synodic/assets/models/tiny_mamba2, 7.5M params, bf16 matrices).
    "tiny_mamba2": HybridConfig(
        model_type="nemotron_h", vocab_size=4096, hidden_size=384, intermediate_size=1024,
        num_hidden_layers=10, hybrid_override_pattern="M-M*-M-M*-", mlp_hidden_act="relu2",
        num_attention_heads=6, num_key_value_heads=2, head_dim=64,
        mamba_num_heads=6, mamba_head_dim=64, ssm_state_size=64, n_groups=1, conv_kernel=4,
        tie_word_embeddings=True),
    # Trained and shipped (synodic/assets/models/tiny_gdn, 7.9M params, bf16 matrices).
    "tiny_gdn": HybridConfig(
        model_type="qwen3_next", vocab_size=4096, hidden_size=384, intermediate_size=1024,
        num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
        mlp_hidden_act="silu", num_attention_heads=6, num_key_value_heads=2, head_dim=64,
        qk_norm=True, partial_rotary_factor=0.5,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64,
        linear_value_head_dim=64, tie_word_embeddings=True),
    "nemotron_h_8b": HybridConfig(
        model_type="nemotron_h", vocab_size=131072, hidden_size=4096, intermediate_size=21504,
        num_hidden_layers=52, hybrid_override_pattern=_nemotron_h_8b_pattern(), mlp_hidden_act="relu2",
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
        chunk_size=128),
    # Qwen3.5-class GDN hybrid (GDN HV=32, Hk=16, K=V=128; full attention every 4th layer). The
    # attention and MLP widths are of the 4B class; only the GDN shapes are pinned by the issue.
    "qwen35_gdn_4b": HybridConfig(
        model_type="qwen3_next", vocab_size=151936, hidden_size=2560, intermediate_size=9216,
        num_hidden_layers=32, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 8,
        mlp_hidden_act="silu", num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        qk_norm=True, partial_rotary_factor=0.25, rope_theta=1e7,
        linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, chunk_size=64, tie_word_embeddings=True),
}

from .presets_dsa import DSA_PRESETS  # noqa: E402  (DSA-class presets with MLA-sized KV rows)

PRESETS.update(DSA_PRESETS)
