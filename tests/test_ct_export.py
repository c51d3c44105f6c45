"""pipeline=quantize pipeline.export_hf: the compressed-tensors folder decodes, through compressed-tensors' own
compressor classes, to exactly synodic's weights (bf16, bit for bit), for both HF families and both formats —
NVFP4 vLLM-fused groups (q/k/v, gate/up) with one shared global scale, their members re-quantized by synodic's
RTN with the group's max per-tensor scale; what the format cannot hold is refused in one line before any
solving."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from hf_folders import hf_model  # noqa: E402
from safetensors import safe_open  # noqa: E402

from synodic.config.errors import ConfigError  # noqa: E402
from synodic.models.hf import hf_plan, load_hf  # noqa: E402
from synodic.quant.config import BlockQuant  # noqa: E402


def _folder(family, d, seed=3):
    hf_model(family, seed=seed).to(torch.bfloat16).save_pretrained(d, max_shard_size="40KB")
    return d


def _tensors(d):
    out = {}
    for f in d.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def _decompress(d):
    """{on-disk weight name: tensor} with every quantized module decoded by compressed-tensors."""
    qc = QuantizationConfig.model_validate(json.loads((d / "config.json").read_text())["quantization_config"])
    tensors = _tensors(d)
    comp = BaseCompressor.get_value_from_registry(qc.format)
    for scheme in qc.config_groups.values():
        for mod in scheme.targets:
            sd = {k[len(mod) + 1:]: tensors.pop(k) for k in list(tensors) if k.startswith(mod + ".weight_")}
            assert "weight_packed" in sd, mod
            tensors[mod + ".weight"] = comp.decompress(sd, scheme)["weight"]
    return qc, tensors


@pytest.mark.parametrize("family,fmt", [("nemotron_h", "nvfp4"), ("nemotron_h", "mxfp4"),
                                        ("qwen3_next", "nvfp4"), ("qwen3_5", "mxfp4"), ("qwen3_5", "nvfp4"),
                                        ("qwen3_next_moe", "nvfp4"), ("nemotron_h_moe", "nvfp4")])
def test_export_decodes_to_synodic_weights(tmp_path, family, fmt):
    from synodic.pipelines.quantize import quantize_to_store

    from synodic.quant.apply import apply_quant
    from synodic.quant.export_ct import CT_FORMATS, export_hf
    from synodic.quant.linear import QuantLinear
    src = _folder(family, tmp_path / "src")
    model = load_hf(src, "cpu", torch.bfloat16, progress=False)
    orig = {k: v.clone() for k, v in model.state_dict().items()}
    qcfg = BlockQuant(kind=fmt, method="rtn")
    res = quantize_to_store(model, qcfg, tmp_path / "store", progress=False)
    ex = export_hf(res["artifact"], src, tmp_path / "out")
    assert ex["format"] == CT_FORMATS[fmt] and ex["quantized"]
    qc, dec = _decompress(tmp_path / "out")
    assert qc.format == CT_FORMATS[fmt] and qc.config_groups["group_0"].input_activations is None
    apply_quant(model, qcfg.model_copy(update={"artifact": res["artifact"]}))
    mods = dict(model.named_modules())
    shared_p = {m: g["p"] for g in ex["shared_scale"].values() for m in g["requantized"]}
    checked = requantized = 0
    # the import mapping (independent of the exporter's inverse) takes the decoded tensors to synodic's layout
    for hf, src_t in hf_plan(src).mapping.sources.items():
        if len(src_t.shape) != 2 or hf not in dec:
            continue
        for name, t, rows in src_t.convert(dec[hf]):
            mod = mods.get(name[: -len(".weight")])
            if isinstance(mod, QuantLinear):
                full = _expected(mod, name, hf, orig, ex)
                P = shared_p.get(hf[: -len(".weight")])
                if P is not None:  # re-quantized: differs from the artifact exactly where the linear's own p < P
                    own = float(mod.qtensor_scale)
                    assert own <= P and (own == P) == torch.equal(full, mod.weight_q), name
                    requantized += 1
                want = full if rows is None else full[rows]
                assert t.dtype == torch.bfloat16 and torch.equal(t.view(torch.int16), want.view(torch.int16)), hf
                checked += 1
    assert checked >= len(res["layers"])
    # vLLM's fused groups: one weight_global_scale each, bit for bit; random weights give q / k / v different p
    assert ex["vllm_fused_scale_mismatch"] == []
    out_t = _tensors(tmp_path / "out")
    if fmt == "nvfp4":
        assert ex["shared_scale"] and requantized == sum(
            len([1 for n in res["layers"] for m in g["requantized"] if _holds(src, m, n)])
            for g in ex["shared_scale"].values())
        has_qkv = any(k.endswith(".qkv") for k in ex["shared_scale"])
        assert has_qkv and requantized > 0
        for g in ex["shared_scale"].values():
            gs = [out_t[m + ".weight_global_scale"] for m in g["members"]]
            assert all(torch.equal(x, gs[0]) for x in gs) and set(g["members"]) <= set(ex["quantized"])
    else:
        assert ex["shared_scale"] == {}
    # everything not quantized is the source's bytes; tokenizer-free folder still loads in synodic
    srct = _tensors(src)
    for k, v in _tensors(tmp_path / "out").items():
        if k in srct and k not in {m + ".weight" for m in ex["dense"]}:
            assert torch.equal(v, srct[k]), k
    if family.startswith("qwen3_next") and fmt == "nvfp4":  # q_proj = q + output gate: packed with one shared scale
        assert any(m.endswith("self_attn.q_proj") for m in ex["quantized"]) and not any(
            m.endswith("self_attn.q_proj") for m in ex["dense"])
    if family == "qwen3_next_moe":  # routers stay dense (transformers / vLLM build them unquantized)
        assert any(m.endswith("mlp.gate") for m in ex["dense"]) and not any(m.endswith("mlp.gate")
                                                                              for m in ex["quantized"])
    assert set(ex["dense"]) <= set(qc.ignore)


def _expected(mod, name: str, hf: str, orig: dict, ex: dict) -> torch.Tensor:
    """synodic's bf16 weight for linear `name` read from on-disk `hf`: its own artifact as it runs, or, in a
    re-quantized member of a shared-scale group, synodic's RTN of the same weight with the group's P."""
    from synodic.quant.qtensor import dequantize, quantize
    P = next((g["p"] for g in ex["shared_scale"].values() if hf[: -len(".weight")] in g["requantized"]), None)
    if P is None:
        return mod.weight_q
    return dequantize(quantize(orig[name].float(), "nvfp4", tensor_scale=torch.tensor(P))).to(torch.bfloat16)


def _holds(src, hf_mod, linear):
    """Whether on-disk module `hf_mod` holds rows of synodic linear `linear`."""
    s = hf_plan(src).mapping.sources[hf_mod + ".weight"]
    return any(n == linear + ".weight" for n, _, _ in s.convert(torch.empty(s.shape, device="meta")))


def test_requantize_refuses_an_artifact_of_other_weights(tmp_path):
    """Re-quantizing reads the folder's weights (in the manifest's model.dtype, else the folder's): each
    group's max-scale member must come out as the artifact holds it, else nothing is written."""
    from synodic.pipelines.quantize import quantize_to_store

    from synodic.quant.export_ct import export_hf
    src = _folder("nemotron_h", tmp_path / "src")
    other = load_hf(_folder("nemotron_h", tmp_path / "other", seed=4), "cpu", torch.bfloat16, progress=False)
    qcfg = BlockQuant(kind="nvfp4", method="rtn")
    res = quantize_to_store(other, qcfg, tmp_path / "s1", progress=False, model_info={"dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="does not reproduce the artifact"):
        export_hf(res["artifact"], src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fused_scale_mismatch():
    from synodic.quant.export_ct import fused_scale_mismatch
    g = {"m.layers.0.self_attn.q_proj": 1.0, "m.layers.0.self_attn.k_proj": 1.0, "m.layers.0.self_attn.v_proj": 2.0,
         "m.layers.0.mlp.gate_proj": 3.0, "m.layers.0.mlp.up_proj": 3.0, "m.layers.0.mlp.down_proj": 5.0}
    assert fused_scale_mismatch(g) == ["m.layers.0.self_attn.qkv"]


def test_export_refuses_what_it_cannot_hold(tmp_path):
    from synodic.quant.export_ct import export_problems
    src = _folder("nemotron_h", tmp_path / "src")
    assert export_problems(BlockQuant(kind="nvfp4", method="rtn"), str(src), str(tmp_path / "o")) == []
    lines = export_problems(BlockQuant(kind="nvfp4", method="dualquant", mode="w4a4"), str(tmp_path), str(src))
    assert len(lines) == 4
    assert "quant.method=dualquant" in lines[0] and "per-input-channel" in lines[0]
    assert "quant.mode=w4a4" in lines[1] and "input_global_scale" in lines[1]
    assert "not a Hugging Face folder" in lines[2] and "not an empty directory" in lines[3]
    assert "no compressed-tensors packed format" in export_problems(
        BlockQuant(kind="mxfp8_e4m3", method="rtn"), str(src), str(tmp_path / "o"))[0]


def test_pipeline_checks_export_before_solving(tmp_path, monkeypatch):
    import synodic.pipelines.quantize as qp

    from synodic.config.compose import compose
    called = []
    monkeypatch.setattr(qp, "quantize_to_store", lambda *a, **k: called.append(1))
    src = _folder("nemotron_h", tmp_path / "src")
    cfg = compose(["pipeline=quantize", "quant=nvfp4", "quant.method=dualquant", "runtime.device=cpu",
                   f"model.weights={src}", f"pipeline.export_hf={tmp_path / 'o'}"])
    with pytest.raises(ConfigError, match="quant.method=dualquant"):
        qp.run(cfg, tmp_path)
    assert not called


@pytest.mark.parametrize("family,fmt", [("nemotron_h", "mxfp4"), ("qwen3_next", "nvfp4")])
def test_transformers_loads_export(tmp_path, family, fmt):
    """transformers' compressed-tensors quantizer reads the config block, finds every target module and
    decompresses (dequantize=True) to synodic's weights; the model then runs."""
    from synodic.pipelines.quantize import quantize_to_store
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    from synodic.quant.apply import apply_quant
    from synodic.quant.export_ct import export_hf
    from synodic.quant.linear import QuantLinear
    src = _folder(family, tmp_path / "src")
    model = load_hf(src, "cpu", torch.bfloat16, progress=False)
    orig = {k: v.clone() for k, v in model.state_dict().items()}
    qcfg = BlockQuant(kind=fmt, method="rtn")
    res = quantize_to_store(model, qcfg, tmp_path / "store", progress=False)
    ex = export_hf(res["artifact"], src, tmp_path / "out")
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16,
                                              quantization_config=CompressedTensorsConfig(dequantize=True))
    sd = lm.state_dict()
    assert not [k for k in sd if k.endswith(("weight_packed", "weight_scale", "weight_global_scale"))]
    apply_quant(model, qcfg.model_copy(update={"artifact": res["artifact"]}))
    mods = dict(model.named_modules())
    seen = set()
    for hf, s in hf_plan(src).mapping.sources.items():
        key = hf if hf in sd else hf.replace("backbone.", "model.", 1)  # transformers' NemotronH module prefix
        if len(s.shape) != 2 or key not in sd:
            continue
        for name, t, rows in s.convert(sd[key]):
            mod = mods.get(name[: -len(".weight")])
            if isinstance(mod, QuantLinear):
                full = _expected(mod, name, hf, orig, ex)
                want = full if rows is None else full[rows]
                assert torch.equal(t.view(torch.int16), want.view(torch.int16)), hf
                seen.add(name[: -len(".weight")])
    assert seen == set(res["layers"])
    assert torch.isfinite(lm(torch.tensor([[1, 2, 3, 4, 5]])).logits).all()


def test_pipeline_run_writes_export(tmp_path):
    from synodic.pipelines.quantize import run

    from synodic.config.compose import compose
    src = _folder("nemotron_h", tmp_path / "src")
    cfg = compose(["pipeline=quantize", "quant=mxfp4", "quant.method=rtn", "pipeline.executor=inline",
                   "runtime.device=cpu", "model.dtype=bfloat16", f"model.weights={src}",
                   f"pipeline.store={tmp_path / 'store'}", f"pipeline.export_hf={tmp_path / 'out'}"])
    out = run(cfg, tmp_path)
    ex = out["quant"]["export_hf"]
    assert ex["format"] == "mxfp4-pack-quantized" and len(ex["quantized"]) == out["metrics"]["layers"]
    cfg_json = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg_json["quantization_config"]["quant_method"] == "compressed-tensors"
    with pytest.raises(ConfigError, match="not an empty directory"):  # a second run does not overwrite silently
        run(cfg, tmp_path)
