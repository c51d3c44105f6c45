"""NemotronH (model_type nemotron_h): config.json fields → HybridConfig, Hub tensor names → synodic's.

One synodic block per layer, as on disk. Layer kinds come from `hybrid_override_pattern` (Hub
configs: M Mamba-2, * attention, - MLP, E MoE) or `layers_block_type` (transformers 5: mamba /
linear_attention, attention / full_attention, mlp, moe). NemotronH attention has no rotary
embeddings (partial_rotary_factor 0); norms are plain RMSNorm weights; the Mamba-2 gated norm is
per group of d_inner / n_groups channels, gate before norm, as synodic's.

MoE layers (Nemotron-3 Nano): `mixer.gate.weight` / `mixer.gate.e_score_correction_bias` (the sigmoid
router, fp32), routed experts one tensor per expert and projection (`mixer.experts.{e}.up_proj.weight`
[I, D'], `down_proj.weight` [D', I], as the Hub and transformers' save_pretrained write them) or stacked
(`mixer.experts.up_proj` [E, I, D'], transformers' in-memory layout), `mixer.shared_experts.up_proj` /
`down_proj`, and with `moe_latent_size` (D' = latent) `mixer.fc1_latent_proj` / `fc2_latent_proj`.
transformers builds one shared expert of `moe_shared_expert_intermediate_size` whatever
`n_shared_experts` says; so does synodic."""
from __future__ import annotations

from pathlib import Path

import torch

from .loader import Mapping, Source, integer, pick, real, require, strings, validated

_KIND = {"M": "M", "mamba": "M", "linear_attention": "M", "*": "*", "attention": "*", "full_attention": "*",
         "-": "-", "mlp": "-", "E": "E", "moe": "E"}


def _pattern(raw: dict, where: Path) -> tuple[str, str]:
    if raw.get("layers_block_type") is not None:
        key, kinds = "layers_block_type", raw["layers_block_type"]
    else:
        key, kinds = "hybrid_override_pattern", pick(raw, where, "hybrid_override_pattern", "layers_block_type")
    # the Hub writes a string of letters, transformers 5 a list of names
    kinds = strings(list(kinds) if isinstance(kinds, str) else kinds, where, key,
                    "a string of M * - E or a list of mamba / attention / mlp / moe, one per layer")
    bad = [k for k in kinds if k not in _KIND]
    require(not bad, lambda: f"{where}: {key} has layer type {bad[0]!r}; expected mamba (M), attention (*), mlp (-), "
                             "moe (E)")
    return key, "".join(_KIND[k] for k in kinds)


def _moe_fields(raw: dict, where: Path, key: str, p: str) -> dict:
    """HybridConfig's MoE fields from a config whose pattern has 'E' layers."""
    if "E" not in p:
        return {}
    what = f"({key} makes layer {p.index('E')} a moe (E) layer)"
    E = pick(raw, where, "n_routed_experts", "num_local_experts")
    require(isinstance(E, int) and E >= 1, f"{where}: n_routed_experts={E!r} {what}; expected an integer >= 1")
    return dict(num_experts=E, num_experts_per_tok=pick(raw, where, "num_experts_per_tok"),
                moe_intermediate_size=pick(raw, where, "moe_intermediate_size"),
                # transformers' shared expert falls back to intermediate_size when this is 0
                shared_expert_intermediate_size=pick(raw, where, "moe_shared_expert_intermediate_size")
                or pick(raw, where, "intermediate_size"),
                norm_topk_prob=bool(raw.get("norm_topk_prob", True)), moe_router="sigmoid",
                # 0 / null mean "not grouped" and "no latent" in transformers' configs
                n_group=integer(raw, where, "n_group", least=0, default=1) or 1,
                topk_group=integer(raw, where, "topk_group", least=0, default=1) or 1,
                routed_scaling_factor=real(raw, where, "routed_scaling_factor", default=1.0) or 1.0,
                shared_expert_gate=False, moe_latent_size=integer(raw, where, "moe_latent_size", least=0, default=0))


def mapping(raw: dict, where: Path, keys: set[str]) -> Mapping:
    key, p = _pattern(raw, where)
    for k in ("use_bias", "mamba_proj_bias", "attention_bias", "mlp_bias"):
        require(not raw.get(k), f"{where}: {k}={raw.get(k)}; expected false (synodic's linears have no bias)")
    act = raw.get("mlp_hidden_act", "relu2")
    require(act == "relu2", f"{where}: mlp_hidden_act={act!r}; expected 'relu2' (NemotronH's squared-ReLU MLP)")
    m_act = raw.get("mamba_hidden_act", "silu")
    require(m_act == "silu", f"{where}: mamba_hidden_act={m_act!r}; expected 'silu'")
    H = integer(raw, where, "hidden_size")
    nq = integer(raw, where, "num_attention_heads")  # head_dim defaults to H // nq
    cfg = validated(dict(
        model_type="nemotron_h", vocab_size=pick(raw, where, "vocab_size"), hidden_size=H,
        intermediate_size=pick(raw, where, "intermediate_size"), num_hidden_layers=len(p),
        hybrid_override_pattern=p, mlp_hidden_act="relu2",
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rms_norm_eps=pick(raw, where, "layer_norm_epsilon", "rms_norm_eps", default=1e-5),
        num_attention_heads=nq, num_key_value_heads=pick(raw, where, "num_key_value_heads", default=nq),
        head_dim=pick(raw, where, "head_dim", "attention_head_dim", default=H // nq), partial_rotary_factor=0.0,
        mamba_num_heads=pick(raw, where, "mamba_num_heads"), mamba_head_dim=pick(raw, where, "mamba_head_dim"),
        ssm_state_size=pick(raw, where, "ssm_state_size"), n_groups=pick(raw, where, "n_groups", "mamba_n_groups"),
        conv_kernel=pick(raw, where, "conv_kernel", "mamba_d_conv"),
        chunk_size=pick(raw, where, "chunk_size", "mamba_chunk_size", default=128),
        initializer_range=raw.get("initializer_range", 0.02), **_moe_fields(raw, where, key, p)), where)
    prefix = "backbone." if any(k.startswith("backbone.") for k in keys) else "model."
    conv_bias = raw.get("use_conv_bias", raw.get("mamba_conv_bias", True))
    return Mapping(cfg, sources(cfg, prefix, keys, conv_bias=conv_bias),
                   zero=[] if conv_bias else [f"blocks.{i}.mixer.conv1d.bias" for i, c in enumerate(p) if c == "M"])


def _same(name: str):
    return lambda t: [(name, t, None)]


def sources(cfg, prefix: str, keys: set[str] = frozenset(), conv_bias: bool = True) -> dict[str, Source]:
    from ..lm import HybridLM
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in HybridLM(cfg).named_parameters()}
    out: dict[str, Source] = {}
    names = {prefix + "embeddings.weight": "embed_tokens.weight", prefix + "norm_f.weight": "norm_f.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for i, c in enumerate(cfg.hybrid_override_pattern):
        layer, blk = f"{prefix}layers.{i}.", f"blocks.{i}."
        names[layer + "norm.weight"] = blk + "norm.weight"
        if c == "E":
            out.update(_moe_sources(cfg, layer + "mixer.", blk + "mixer.", shapes, keys))
            continue
        subs = {"M": ["in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"]
                + (["conv1d.bias"] if conv_bias else []),
                "*": ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"],
                "-": ["up_proj.weight", "down_proj.weight"]}[c]
        for s in subs:
            names[layer + "mixer." + s] = blk + "mixer." + s
    return {**{hf: Source(shapes[syn], _same(syn)) for hf, syn in names.items()}, **out}


def _moe_sources(cfg, hf: str, syn: str, shapes: dict, keys: set[str]) -> dict[str, Source]:
    names = {hf + "gate.weight": syn + "gate.weight",
             hf + "gate.e_score_correction_bias": syn + "gate.e_score_correction_bias"}
    if cfg.shared_expert_intermediate_size:
        for s in ("up_proj.weight", "down_proj.weight"):
            names[hf + "shared_experts." + s] = syn + "shared_expert." + s
    if cfg.moe_latent_size:
        for s in ("fc1_latent_proj.weight", "fc2_latent_proj.weight"):
            names[hf + s] = syn + s
    out = {k: Source(shapes[v], _same(v)) for k, v in names.items()}
    if hf + "experts.up_proj" in keys:  # stacked, as transformers holds them in memory
        for s in ("up_proj", "down_proj"):
            out[hf + "experts." + s] = Source(shapes[syn + s], _same(syn + s))
        return out
    for e in range(cfg.num_experts):
        for s in ("up_proj", "down_proj"):
            out[f"{hf}experts.{e}.{s}.weight"] = Source(shapes[syn + s][1:], lambda t, e=e, s=s: [(syn + s, t, e)])
    return out
