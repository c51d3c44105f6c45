"""Qwen3-Next (model_type qwen3_next): config.json fields → HybridConfig, Hub tensor names and
layouts → synodic's.

Each layer is two synodic blocks: the mixer (input_layernorm + linear_attn / self_attn) and the MLP
(post_attention_layernorm + mlp). Layouts that differ from synodic's:
- in_proj_qkvz is interleaved per key head, [Hk, (q K, k K, v r·V, z r·V)] with r = HV / Hk, and
  in_proj_ba is [Hk, (b r, a r)]; synodic's rows are [q | k | v | z] and [b | a].
- RMSNorm weights are zero-centred (x · (1 + w)): input/post-attention norms, the final norm and the
  q / k norms get 1 added; the GDN output norm is a plain weight of one head (V), shared by all HV
  heads, normalising before the gate (norm(y) · silu(z), `gdn_norm_before_gate`).
- q_proj holds per head [query hd | output gate hd]: synodic's q_proj and o_gate (`attn_output_gate`).
- the GDN conv has no bias (synodic's is zero).
Rotary: `rope_theta` / `partial_rotary_factor` at the top level (Hub configs) or in
`rope_parameters` (transformers 5); only the default (unscaled) RoPE is implemented."""
from __future__ import annotations

from pathlib import Path

import torch

from synodic.config.files import shown

from .loader import Mapping, Source, integer, pick, real, require, strings, validated


def _rope(raw: dict, where: Path) -> tuple[float, float]:
    rp = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for key, v in (("rope_parameters", rp), ("rope_scaling", scaling)):
        require(isinstance(v, dict), lambda key=key, v=v: f"{where}: {key}={shown(repr(v), 60)}; expected an "
                                                            "object {rope_type, rope_theta, ...} or null")
    kind = rp.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    require(kind == "default", f"{where}: rope_type={kind!r} (rope_parameters / rope_scaling); expected "
                               "'default' (synodic implements unscaled RoPE)")
    theta = real(rp, where, "rope_theta", default=None)
    frac = real(rp, where, "partial_rotary_factor", default=None)
    return (real(raw, where, "rope_theta", default=10000.0) if theta is None else theta,
            real(raw, where, "partial_rotary_factor", default=0.25) if frac is None else frac)


def _layer_types(raw: dict, where: Path, n: int) -> list[str]:
    lt = raw.get("layer_types")
    if lt is None:
        every = integer(raw, where, "full_attention_interval", default=4)
        lt = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    strings(lt, where, "layer_types", "a list of linear_attention / full_attention, one per layer")
    bad = [t for t in lt if t not in ("linear_attention", "full_attention")]
    require(not bad, lambda: f"{where}: layer_types has {bad[0]!r}; expected linear_attention or full_attention")
    return list(lt)


def mapping(raw: dict, where: Path, keys: set[str]) -> Mapping:
    split = raw.get("model_type") in ("qwen3_5", "qwen3_5_text")
    if raw.get("model_type") == "qwen3_5":  # the multimodal wrapper: the language model's config is nested
        text = raw.get("text_config")
        require(isinstance(text, dict), f"{where}: model_type='qwen3_5' without a text_config object; expected "
                                        "the language model's config under text_config")
        raw = {"tie_word_embeddings": raw.get("tie_word_embeddings", False), **text}
    n = integer(raw, where, "num_hidden_layers")
    act = raw.get("hidden_act", "silu")
    require(act == "silu", f"{where}: hidden_act={act!r}; expected 'silu' (SwiGLU MLPs, SiLU conv)")
    require(not raw.get("attention_bias"), f"{where}: attention_bias={raw.get('attention_bias')}; expected false")
    theta, frac = _rope(raw, where)
    fields = dict(
        model_type="qwen3_next", vocab_size=pick(raw, where, "vocab_size"), hidden_size=pick(raw, where, "hidden_size"),
        intermediate_size=pick(raw, where, "intermediate_size"), num_hidden_layers=n,
        layer_types=_layer_types(raw, where, n), mlp_hidden_act="silu",
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        num_attention_heads=pick(raw, where, "num_attention_heads"),
        num_key_value_heads=pick(raw, where, "num_key_value_heads"), head_dim=pick(raw, where, "head_dim"),
        rope_theta=theta, partial_rotary_factor=frac, qk_norm=True, attn_output_gate=True,
        linear_num_value_heads=pick(raw, where, "linear_num_value_heads"),
        linear_num_key_heads=pick(raw, where, "linear_num_key_heads"),
        linear_key_head_dim=pick(raw, where, "linear_key_head_dim"),
        linear_value_head_dim=pick(raw, where, "linear_value_head_dim"),
        linear_conv_kernel_dim=raw.get("linear_conv_kernel_dim", 4), gdn_norm_before_gate=True,
        initializer_range=raw.get("initializer_range", 0.02))
    if raw.get("num_experts"):
        fields.update(num_experts=raw["num_experts"], num_experts_per_tok=pick(raw, where, "num_experts_per_tok"),
                      moe_intermediate_size=pick(raw, where, "moe_intermediate_size"),
                      shared_expert_intermediate_size=raw.get("shared_expert_intermediate_size") or 0,
                      norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
                      decoder_sparse_step=integer(raw, where, "decoder_sparse_step", default=1),
                      mlp_only_layers=raw.get("mlp_only_layers") or [])
    cfg = validated(fields, where)
    prefix = "model.language_model." if any(k.startswith("model.language_model.") for k in keys) else "model."
    return Mapping(cfg, sources(cfg, keys, prefix, split),
                   zero=[f"blocks.{2 * i}.mixer.conv1d.bias" for i, t in enumerate(cfg.layer_types)
                         if t == "linear_attention"],
                   ignore=(r"^mtp\.", r"rotary_emb\.inv_freq$", r"^model\.visual\.", r"^visual\."))


def _same(name):
    return lambda t: [(name, t, None)]


def _plus_one(name):
    # zero-centred RMSNorm weight: transformers computes x · (1 + w) in fp32
    return lambda t: [(name, t.float() + 1.0, None)]


def sources(cfg, keys: set[str], prefix: str = "model.", split: bool = False) -> dict[str, Source]:
    """On-disk name → Source for every tensor; `split`: Qwen3.5's GDN projections in_proj_qkv (already
    [q | k | v]), in_proj_z, in_proj_b, in_proj_a instead of the interleaved in_proj_qkvz / in_proj_ba."""
    from ..lm import HybridLM
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in HybridLM(cfg).named_parameters()}
    D = cfg.hidden_size
    Hk, HV, K, V = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    r = HV // Hk
    nq, hd = cfg.num_attention_heads, cfg.head_dim
    C = 2 * Hk * K + HV * V  # GDN conv channels: q, k, v
    out: dict[str, Source] = {
        prefix + "embed_tokens.weight": Source(shapes["embed_tokens.weight"], _same("embed_tokens.weight")),
        prefix + "norm.weight": Source(shapes["norm_f.weight"], _plus_one("norm_f.weight")),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = Source(shapes["lm_head.weight"], _same("lm_head.weight"))
    for i, t in enumerate(cfg.layer_types):
        L, mix, mlp = f"{prefix}layers.{i}.", f"blocks.{2 * i}.", f"blocks.{2 * i + 1}."
        out[L + "input_layernorm.weight"] = Source(shapes[mix + "norm.weight"], _plus_one(mix + "norm.weight"))
        out[L + "post_attention_layernorm.weight"] = Source(shapes[mlp + "norm.weight"],
                                                            _plus_one(mlp + "norm.weight"))
        if t == "linear_attention":
            a, m = L + "linear_attn.", mix + "mixer."

            def qkvz(w, m=m):
                q, k, v, z = w.unflatten(0, (Hk, -1)).split([K, K, r * V, r * V], dim=1)
                return [(m + "in_proj_qkvz.weight", torch.cat([x.flatten(0, 1) for x in (q, k, v, z)]), None)]

            def ba(w, m=m):
                b, a_ = w.unflatten(0, (Hk, 2 * r)).split([r, r], dim=1)
                return [(m + "in_proj_ba.weight", torch.cat([b.flatten(0, 1), a_.flatten(0, 1)]), None)]

            if split:
                out[a + "in_proj_qkv.weight"] = Source((C, D), lambda w, m=m: [(m + "in_proj_qkvz.weight", w,
                                                                                  slice(0, C))])
                out[a + "in_proj_z.weight"] = Source((HV * V, D), lambda w, m=m: [(m + "in_proj_qkvz.weight", w,
                                                                                     slice(C, None))])
                out[a + "in_proj_b.weight"] = Source((HV, D), lambda w, m=m: [(m + "in_proj_ba.weight", w,
                                                                                 slice(0, HV))])
                out[a + "in_proj_a.weight"] = Source((HV, D), lambda w, m=m: [(m + "in_proj_ba.weight", w,
                                                                                 slice(HV, None))])
            else:
                out[a + "in_proj_qkvz.weight"] = Source((Hk * (2 * K + 2 * r * V), D), qkvz)
                out[a + "in_proj_ba.weight"] = Source((2 * HV, D), ba)
            out[a + "norm.weight"] = Source((V,), lambda w, m=m: [(m + "norm.weight", w.repeat(HV), None)])
            for s in ("conv1d.weight", "dt_bias", "A_log", "out_proj.weight"):
                out[a + s] = Source(shapes[m + s], _same(m + s))
        else:
            a, m = L + "self_attn.", mix + "mixer."

            def q_gate(w, m=m):
                q, g = w.unflatten(0, (nq, 2, hd)).unbind(1)
                return [(m + "q_proj.weight", q.flatten(0, 1), None), (m + "o_gate.weight", g.flatten(0, 1), None)]

            out[a + "q_proj.weight"] = Source((2 * nq * hd, D), q_gate)
            for s in ("k_proj.weight", "v_proj.weight", "o_proj.weight"):
                out[a + s] = Source(shapes[m + s], _same(m + s))
            for s in ("q_norm.weight", "k_norm.weight"):
                out[a + s] = Source(shapes[m + s], _plus_one(m + s))
        if cfg.moe_layer(i):
            out.update(_moe_sources(cfg, L + "mlp.", mlp + "mixer.", shapes, keys))
        else:
            for s in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
                out[L + "mlp." + s] = Source(shapes[mlp + "mixer." + s], _same(mlp + "mixer." + s))
    return out


def _moe_sources(cfg, hf: str, syn: str, shapes: dict, keys: set[str]) -> dict[str, Source]:
    """The sparse MoE block: router `gate`, shared expert + its gate, and the routed experts, either one
    tensor per expert and projection (Hub checkpoints: experts.{e}.gate_proj / up_proj / down_proj) or
    transformers' stacked experts.gate_up_proj [E, 2I, D] / experts.down_proj [E, D, I]."""
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    out = {hf + "gate.weight": Source(shapes[syn + "gate.weight"], _same(syn + "gate.weight"))}
    if cfg.shared_expert_intermediate_size:
        for s in ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight",
                  "shared_expert_gate.weight"):
            out[hf + s] = Source(shapes[syn + s], _same(syn + s))
    if hf + "experts.gate_up_proj" in keys:
        for s in ("gate_up_proj", "down_proj"):
            out[hf + "experts." + s] = Source(shapes[syn + s], _same(syn + s))
        return out
    D = cfg.hidden_size
    for e in range(E):
        x = f"{hf}experts.{e}."
        out[x + "gate_proj.weight"] = Source((I, D), lambda t, e=e: [(syn + "gate_up_proj", t, (e, slice(0, I)))])
        out[x + "up_proj.weight"] = Source((I, D), lambda t, e=e: [(syn + "gate_up_proj", t, (e, slice(I, 2 * I)))])
        out[x + "down_proj.weight"] = Source((D, I), lambda t, e=e: [(syn + "down_proj", t, e)])
    return out
