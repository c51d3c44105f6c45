"""Export a pipeline=quantize artifact as a Hugging Face folder in the compressed-tensors layout (the
`quantization_config` block vLLM and llm-compressor read). See docs/checkpoints.md.

Only what decodes to synodic's weights bit for bit is written quantized:
- formats: nvfp4 -> `nvfp4-pack-quantized` (weight_packed uint8, weight_scale float8_e4m3fn per 16,
  weight_global_scale fp32 [1]); mxfp4 -> `mxfp4-pack-quantized` (weight_packed, weight_scale uint8 E8M0
  per 32). Codes and nibble order are synodic's own (E2M1, even element in the low nibble), so the
  packed bytes and block-scale bytes are copied unchanged.
- compressed-tensors decodes an NVFP4 block as v * (s / g) in fp32, cast to bfloat16 (its FP4 unpacker
  works in bf16); synodic decodes v * (p * s). g = fl(1/p) (or an fp32 neighbour) is chosen so the two
  agree in bfloat16 for every E2M1 value and every block-scale code the tensor uses; a tensor with no
  such g is written dense (exact) instead.
- quant.method rtn only: dualquant / smoothquant apply a per-input-channel multiplier s (x * s) that
  the format has no slot for. Weight-only only: synodic's W4A4 activation quantizer (NVFP4: dynamic
  per-call amax; MXFP4: floor / rceil E8M0 rule) differs from compressed-tensors' (NVFP4: static
  input_global_scale; MXFP4: round-to-nearest-power-of-two rule).
- an on-disk tensor made of several synodic linears whose NVFP4 global scales differ (Qwen3-Next's
  q_proj = q + output gate), or of quantized and unquantized parts, is written dense with synodic's
  dequantized values and listed in `ignore`.
Every other tensor, and every non-weight file, is copied from the source folder byte for byte.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from synodic.config.errors import ConfigError

log = logging.getLogger(__name__)

CT_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized"}
_E2M1 = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # positive nonzero magnitudes (sign and 0 are exact)
_SEARCH_ULPS = 16
_ROUTERS = {"gate", "shared_expert_gate"}  # Qwen3-Next MoE: mlp.gate, mlp.shared_expert_gate (not quantized there)


def export_problems(qcfg, weights: str, out: str, overwrite: bool = False) -> list[str]:
    """One line per reason `pipeline.export_hf=out` cannot be written exactly (checked before solving)."""
    from synodic.models.hf import is_hf_folder
    key = f"pipeline.export_hf={out!r}"
    lines = []
    if qcfg.kind not in CT_FORMATS:
        lines.append(f"{key}: quant={qcfg.kind} has no compressed-tensors packed format; expected quant="
                     f"{' or quant='.join(CT_FORMATS)}")
    if qcfg.method != "rtn":
        lines.append(f"{key}: quant.method={qcfg.method} multiplies activations by a per-input-channel scale s "
                     f"(x * s) that compressed-tensors {qcfg.kind} has no slot for; expected quant.method=rtn")
    if qcfg.act_quant:
        why = ("synodic scales NVFP4 activations by a dynamic per-call amax, compressed-tensors needs a static "
               "calibrated input_global_scale" if qcfg.kind == "nvfp4" else
               f"synodic's {qcfg.rule} E8M0 activation scale rule differs from compressed-tensors' dynamic MX rule "
               "(round to the nearest power of two)")
        lines.append(f"{key}: quant.mode={qcfg.resolved_mode} cannot be represented exactly ({why}); expected a "
                     "weight-only mode (quant.mode=w4a16)")
    if not is_hf_folder(weights):
        lines.append(f"{key}: model.weights={weights!r} is not a Hugging Face folder; expected model.weights=<HF "
                     "folder> (the export reuses its config.json, tokenizer and unquantized tensors)")
    o = Path(out)
    if o.exists() and not overwrite and (not o.is_dir() or any(o.iterdir())):
        lines.append(f"{key}: exists and is not an empty directory; expected a new or empty directory "
                     "(pipeline.overwrite=true replaces it)")
    return lines


# ---------------------------------------------------------------- scale mapping
def _ct_value(fmt: str, codes: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """compressed-tensors' dequantized value (bf16) of each E2M1 magnitude x each block-scale code."""
    v = _E2M1.to(torch.bfloat16).unsqueeze(1)
    if fmt == "mxfp4":  # decompress_mx_scale: 2 ** (code - 127) in bf16, times the bf16 FP4 value
        return v * (2.0 ** (codes.to(torch.int32) - 127).to(torch.bfloat16)).unsqueeze(0)
    s = codes.view(torch.float8_e4m3fn).to(torch.bfloat16)  # _decompress_scale(scale, bf16)
    return (v.float() * (s / g).unsqueeze(0)).to(torch.bfloat16)  # bf16 / fp32 [1] -> fp32, product, cast


def _synodic_value(fmt: str, codes: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    from synodic.quant import mx, nvfp4
    v = _E2M1.unsqueeze(1)
    d = mx.e8m0_to_fp32(codes) if fmt == "mxfp4" else nvfp4.nvfp4_block_scale_fp32(codes, p)
    return (v * d.unsqueeze(0)).to(torch.bfloat16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def global_scale(fmt: str, scale_codes: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor | None:
    """NVFP4: the fp32 weight_global_scale g [1] with which compressed-tensors decodes every block-scale code
    in `scale_codes` to synodic's value in bf16; MXFP4: None. Raises ValueError when none exists (a code
    synodic decodes to NaN, or no g within a few ulps of 1/p)."""
    codes = torch.unique(scale_codes.reshape(-1).cpu())
    want = _synodic_value(fmt, codes, None if p is None else p.reshape(1).float().cpu())
    if fmt == "mxfp4":
        if not _same_bits(_ct_value(fmt, codes, None), want):
            raise ValueError("an E8M0 scale code (255: NaN) decodes differently in compressed-tensors")
        return None
    g0 = torch.ones(1) if p is None else (1.0 / p.reshape(1).float().cpu())
    bits = g0.view(torch.int32)
    for d in [0] + [x for k in range(1, _SEARCH_ULPS + 1) for x in (k, -k)]:
        g = (bits + d).view(torch.float32)
        if _same_bits(_ct_value(fmt, codes, g), want):
            return g
    raise ValueError(f"no fp32 global scale within {_SEARCH_ULPS} ulps of 1/p decodes every block scale as p * s")


# ---------------------------------------------------------------- the inverse tensor mapping
def _row_sources(mapping) -> dict[str, list[tuple]]:
    """On-disk 2-D tensor name -> [(synodic parameter, its rows filled (slice or None), their on-disk rows)],
    found by running the import mapping on a column of row numbers (no layout written twice)."""
    out = {}
    for hf, src in mapping.sources.items():
        if len(src.shape) != 2:
            continue
        probe = torch.arange(src.shape[0], dtype=torch.float64).unsqueeze(1)
        pieces = []
        for name, t, rows in src.convert(probe):
            if rows is not None and not isinstance(rows, slice):
                pieces = None  # into a stacked (expert) tensor: not an nn.Linear weight
                break
            pieces.append((name, rows, t[:, 0].long()))
        if pieces:
            out[hf] = pieces
    return out


def _dequant_rows(layer: dict, fmt: str, shape) -> torch.Tensor:
    from synodic.quant.qtensor import QTensor, dequantize
    return dequantize(QTensor(fmt, layer["qdata"], layer["qscale"], layer["qtensor_scale"], tuple(shape)))


def _hf_tensors(hf: str, src_t: torch.Tensor, pieces, layers: dict, fmt: str, shapes: dict):
    """({name: tensor} to write for on-disk weight `hf`, quantized?) — packed when every piece is a quantized
    linear sharing one global scale, else dense with synodic's values in the source dtype."""
    names = [n[: -len(".weight")] for n, _, _ in pieces]
    quant = [n in layers for n in names]
    if not any(quant):
        return {hf: src_t}, False
    # each piece: synodic linear n, its rows rsel, and the on-disk rows hf_rows they land in
    placed = [(n, torch.arange(shapes[pname][0])[rows if rows is not None else slice(None)], hf_rows)
              for (pname, rows, hf_rows), n in zip(pieces, names)]
    g, why = None, None
    if hf.rsplit(".", 2)[-2] in _ROUTERS:
        why = "an MoE router / shared-expert gate, which transformers and vLLM build unquantized"
    elif not all(quant):
        why = "quantized and unquantized synodic linears share it"
    elif fmt == "nvfp4":
        ps = {None if layers[n]["qtensor_scale"] is None else float(layers[n]["qtensor_scale"].reshape(-1)[0])
              for n in names}
        if len(ps) > 1:
            why = f"its synodic linears {sorted(set(names))} have different NVFP4 per-tensor scales"
    if why is None:
        first = layers[names[0]]
        packed = first["qdata"].new_empty((src_t.shape[0], first["qdata"].shape[1]))
        scale = first["qscale"].new_empty((src_t.shape[0], first["qscale"].shape[1]))
        for n, rsel, hf_rows in placed:
            packed[hf_rows] = layers[n]["qdata"][rsel]
            scale[hf_rows] = layers[n]["qscale"][rsel]
        try:
            g = global_scale(fmt, scale, first["qtensor_scale"])
        except ValueError as e:
            why = str(e)
    if why is not None:
        log.warning("export_hf: %s written dense (%s): compressed-tensors %s cannot hold it exactly", hf, why, fmt)
        dense = src_t.float().clone()
        for n, rsel, hf_rows in placed:
            if n in layers:
                dense[hf_rows] = _dequant_rows(layers[n], fmt, shapes[n + ".weight"])[rsel]
        return {hf: dense.to(src_t.dtype)}, False
    mod = hf[: -len(".weight")]
    out = {f"{mod}.weight_packed": packed.contiguous(),
           f"{mod}.weight_scale": (scale.view(torch.float8_e4m3fn) if fmt == "nvfp4" else scale).contiguous()}
    if g is not None:
        out[f"{mod}.weight_global_scale"] = g.reshape(1).contiguous()
    return out, True


def quantization_config(fmt: str, targets: list[str], ignore: list[str]) -> dict:
    """The config.json block (compressed-tensors' QuantizationConfig, weight-only preset of the format)."""
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme
    preset = {"nvfp4": "NVFP4A16", "mxfp4": "MXFP4A16"}[fmt]
    scheme = QuantizationScheme(targets=targets, **preset_name_to_scheme(preset, targets).model_dump(
        exclude={"targets", "format"}), format=CT_FORMATS[fmt])
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=CT_FORMATS[fmt], ignore=ignore,
                            quantization_status="compressed")
    return {"version": compressed_tensors.__version__, "quant_method": "compressed-tensors",
            "sparsity_config": {}, "transform_config": {}, **qc.model_dump(exclude={"quant_method"}, mode="json")}


def export_hf(artifact: str | Path, src: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """Write `out` from the complete artifact `artifact` of the model loaded from the HF folder `src`.
    Returns {out, format, quantized: [on-disk modules], dense: [...], ignore: [...]}."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from synodic.models.hf import hf_plan
    from synodic.models.hf.loader import INDEX, SINGLE, shards
    from synodic.quant import store
    artifact, src, out = Path(artifact), Path(src), Path(out)
    manifest, layers = store.load(artifact)
    fmt = manifest["format"]
    if fmt not in CT_FORMATS or manifest.get("method") != "rtn":
        raise ConfigError([f"pipeline.export_hf={str(out)!r}: artifact {artifact} is {fmt} "
                           f"{manifest.get('method')}; expected an {' or '.join(CT_FORMATS)} rtn artifact"])
    mapping = hf_plan(src).mapping
    from synodic.models.lm import HybridLM
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in HybridLM(mapping.config).named_parameters()}
    rows = _row_sources(mapping)
    missing = [n for n in layers if not any(n + ".weight" == p for ps in rows.values() for p, _, _ in ps)]
    if missing:
        raise ConfigError([f"pipeline.export_hf: quantized linear {missing[0]} has no on-disk tensor in {src}; "
                           "expected the artifact of the model loaded from that folder"])
    if out.exists() and overwrite:
        shutil.rmtree(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    quantized, dense, weight_map, globals_ = [], [], {}, {}
    try:
        for shard in shards(src):
            tensors = {}
            with safe_open(str(shard), "pt") as f:
                for k in f.keys():
                    t = f.get_tensor(k)
                    if k in rows:
                        got, q = _hf_tensors(k, t, rows[k], layers, fmt, shapes)
                        if q:
                            quantized.append(k[: -len(".weight")])
                            gs = got.get(k[: -len(".weight")] + ".weight_global_scale")
                            if gs is not None:
                                globals_[k[: -len(".weight")]] = float(gs[0])
                        elif any(n[: -len(".weight")] in layers for n, _, _ in rows[k]):
                            dense.append(k[: -len(".weight")])
                        tensors.update(got)
                    else:
                        tensors[k] = t
            save_file(tensors, str(tmp / shard.name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, shard.name))
        if (src / INDEX).is_file() or shard.name != SINGLE:
            size = sum((tmp / s).stat().st_size for s in set(weight_map.values()))
            (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map},
                                                indent=2))
        for p in src.iterdir():  # tokenizer, generation config, ...: as they are
            if p.is_file() and p.name not in {INDEX, "config.json"} and not p.name.endswith(".safetensors"):
                shutil.copy2(p, tmp / p.name)
        ignore = sorted({k[: -len(".weight")] for k in rows} - set(quantized) | {"lm_head"})
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = quantization_config(fmt, sorted(quantized), ignore)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    split = fused_scale_mismatch(globals_)
    if split:
        log.warning("export_hf: %d fused groups (e.g. %s) have different NVFP4 global scales per projection; "
                    "compressed-tensors decodes them exactly, but vLLM keeps one global scale (the max) per fused "
                    "layer, so serve this folder in vLLM only once synodic shares p across them", len(split), split[0])
    return {"out": str(out), "format": CT_FORMATS[fmt], "quantized": sorted(quantized), "dense": sorted(dense),
            "ignore": cfg["quantization_config"]["ignore"], "vllm_fused_scale_mismatch": split}


# projections vLLM fuses into one layer (QKVParallelLinear / MergedColumnParallelLinear), keyed by leaf name
_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def fused_scale_mismatch(global_scales: dict[str, float]) -> list[str]:
    """Fused groups ('<parent>.qkv', '<parent>.gate_up') whose members' weight_global_scale differ."""
    groups: dict[str, set[float]] = {}
    for mod, g in global_scales.items():
        parent, _, leaf = mod.rpartition(".")
        if leaf in _FUSED:
            groups.setdefault(f"{parent}.{_FUSED[leaf]}", set()).add(g)
    return sorted(k for k, v in groups.items() if len(v) > 1)
