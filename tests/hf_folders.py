"""Tiny random Hugging Face folders built with transformers' own classes (no Hub access): what the HF
loading tests (tests/test_hf_*.py) and the README example load. Weights are re-drawn at unit scale
(transformers' init leaves the mixers' contributions near zero, which would make parity trivial)."""
from __future__ import annotations

from pathlib import Path

import torch

NEMOTRON_H = dict(vocab_size=320, hidden_size=64, intermediate_size=96,
                  layers_block_type=["mamba", "mlp", "attention", "mamba", "mlp", "mamba"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=8,
                  tie_word_embeddings=False)
QWEN3_NEXT = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=12,
                  num_experts=0, tie_word_embeddings=True)
NEMOTRON_H_MOE = dict(NEMOTRON_H, layers_block_type=["mamba", "moe", "attention", "mamba", "mlp", "moe", "mamba"],
                      n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                      moe_shared_expert_intermediate_size=40, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      norm_topk_prob=True)
QWEN3_5 = {k: v for k, v in QWEN3_NEXT.items() if k != "num_experts"}  # Qwen3.5 text: dense, split projections
QWEN3_NEXT_MOE = dict(QWEN3_NEXT, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                      shared_expert_intermediate_size=40, decoder_sparse_step=1, mlp_only_layers=[1])


def hf_model(family: str, seed: int = 0, **over):
    from transformers import NemotronHConfig, NemotronHForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM
    torch.manual_seed(seed)
    if family in ("nemotron_h", "nemotron_h_moe"):
        base = NEMOTRON_H_MOE if family == "nemotron_h_moe" else NEMOTRON_H
        model = NemotronHForCausalLM(NemotronHConfig(**{**base, **over}))
    elif family == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**QWEN3_5, **over}))
    else:
        base = QWEN3_NEXT_MOE if family == "qwen3_next_moe" else QWEN3_NEXT
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**{**base, **over}))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 * p.shape[-1] ** -0.5))
            elif name.endswith("dt_bias"):
                # softplus(dt) stays far above time_step_min: transformers clamps dt there in prefill only
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "norm" in name:
                # Qwen3-Next's RMSNorms are zero-centred (x * (1 + w)) except the GDN output norm
                plain = family.startswith("nemotron_h") or name.endswith("linear_attn.norm.weight")
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if plain else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # NemotronH router: the bias changes which experts win
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
    return model.eval()


def write_folder(family: str, out: Path, seed: int = 0, shard: str = "40KB", tokenizer: bool = False, **over):
    """save_pretrained sharded into `out`; with `tokenizer`, a small BPE tokenizer.json trained on a
    few sentences (+ generation_config.json's EOS)."""
    model = hf_model(family, seed, **over)
    model.save_pretrained(out, max_shard_size=shard)
    if tokenizer:
        write_tokenizer(out, model.config.vocab_size)
    return model


def write_tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The quick brown fox jumps over the lazy dog.", "A hybrid model mixes state space layers and attention.",
            "Hello world, hello synodic."] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(Path(out) / "tokenizer.json"))


def main(argv=None):
    """python -m tests.hf_folders {nemotron_h,nemotron_h_moe,qwen3_next,qwen3_next_moe,qwen3_5} OUT: a tiny random
    folder with a tokenizer, the README's `model.weights=` example (needs transformers: pip install -e '.[dev]')."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    ap.add_argument("family", choices=["nemotron_h", "nemotron_h_moe", "qwen3_next", "qwen3_next_moe", "qwen3_5"])
    ap.add_argument("out")
    a = ap.parse_args(argv)
    write_folder(a.family, Path(a.out), tokenizer=True)
    print(a.out)


if __name__ == "__main__":
    # `python -m tests.hf_folders` from the checkout puts the repo root first on sys.path, where its `kernels/`
    # (synodic.kernels) would shadow Hugging Face's `kernels`, which transformers imports: drop the root
    import sys
    _root = Path(__file__).resolve().parents[1]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _root]
    main()
