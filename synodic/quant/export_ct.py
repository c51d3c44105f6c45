"""Export a pipeline=quantize artifact as a Hugging Face folder in the compressed-tensors layout (the
`quantization_config` block vLLM and llm-compressor read). See docs/checkpoints.md.

Only what decodes bit for bit to synodic's weights (its artifact; in re-quantized members, synodic's RTN
with the group's shared scale) is written quantized:
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
- NVFP4: vLLM fuses q/k/v, gate/up (and Qwen3.5's in_proj_qkv/z, in_proj_b/a) into one layer with one
  weight_global_scale, so each such group, and each on-disk tensor made of several synodic linears
  (Qwen3-Next's q_proj = query + output gate), is written with one shared per-tensor scale P = the
  max of its members' p (what llm-compressor does: the min of their global scales) and one g valid for
  every block-scale code: members whose own p is smaller are re-quantized (RTN, from the source folder's
  weights) with P. Those rows are then not synodic's in-memory artifact, which keeps per-linear p: the
  result's `shared_scale` lists every group and the members re-quantized.
- an on-disk tensor made of quantized and unquantized parts is written dense with synodic's
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


# projections vLLM fuses into one layer (QKVParallelLinear / MergedColumnParallelLinear), keyed by leaf name
_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up",
          "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz", "in_proj_b": "in_proj_ba",
          "in_proj_a": "in_proj_ba"}


def _fused_group(mod: str) -> str | None:
    parent, _, leaf = mod.rpartition(".")
    return f"{parent}.{_FUSED[leaf]}" if leaf in _FUSED else None


def _all_block_codes() -> torch.Tensor:
    """Every E4M3 block-scale code NVFP4 RTN can produce (the block scale is clamped to [2^-6, 448])."""
    from synodic.quant.elements import E4M3
    from synodic.quant.nvfp4 import E4M3_TINY
    lo, hi = (int(E4M3.encode(torch.tensor([v]))[0]) for v in (E4M3_TINY, E4M3.max))
    return torch.arange(lo, hi + 1, dtype=torch.uint8)


def shared_scales(rows: dict, layers: dict, fmt: str) -> dict[str, dict]:
    """NVFP4: group name -> {members: on-disk modules, p: the shared per-tensor scale P (max of the
    members' p), g: one weight_global_scale decoding every block-scale code at P, requantize: members
    holding a linear whose own p < P}. Groups: vLLM's fused ones, and any on-disk tensor of several
    synodic linears; only those whose every piece is a quantized linear with a per-tensor scale."""
    if fmt != "nvfp4":
        return {}
    groups: dict[str, list[str]] = {}
    for hf, pieces in rows.items():
        mod = hf[: -len(".weight")]
        key = _fused_group(mod) or (mod if len(pieces) > 1 else None)
        if key is not None:
            groups.setdefault(key, []).append(hf)
    out = {}
    codes = _all_block_codes()
    for key, members in groups.items():
        names = [n[: -len(".weight")] for hf in members for n, _, _ in rows[hf]]
        if any(n not in layers or layers[n]["qtensor_scale"] is None for n in names) or \
                any(hf.rsplit(".", 2)[-2] in _ROUTERS for hf in members):
            continue
        ps = {n: layers[n]["qtensor_scale"].reshape(1).float().cpu() for n in names}
        P = max(ps.values(), key=float)
        try:
            g = global_scale(fmt, codes, P)
        except ValueError as e:
            log.warning("export_hf: %s keeps per-linear NVFP4 scales (%s)", key, e)
            continue
        out[key] = {"members": sorted(m[: -len(".weight")] for m in members), "p": P, "g": g,
                    "requantize": sorted(hf[: -len(".weight")] for hf in members
                                         if any(float(ps[n[: -len(".weight")]]) != float(P) for n, _, _ in rows[hf]))}
    return out


def _requantize(hf: str, src_t: torch.Tensor, placed, layers: dict, P: torch.Tensor, dtype: torch.dtype):
    """(packed, block-scale codes) of on-disk weight `hf` quantized by RTN with per-tensor scale P. With P
    fixed, NVFP4 RTN is local to each block of 16 in a row, so the on-disk tensor (rows of synodic linears
    rearranged) is quantized as it is. A piece whose own p is P must come out as the artifact holds it:
    otherwise the artifact is not of these weights in `dtype`, and nothing is written."""
    from synodic.quant.qtensor import quantize
    q = quantize(src_t.to(dtype).float(), "nvfp4", tensor_scale=P)
    for n, rsel, hf_rows in placed:
        lay = layers[n]
        if float(lay["qtensor_scale"].reshape(-1)[0]) != float(P):
            continue
        if not (torch.equal(q.data[hf_rows], lay["qdata"][rsel])
                and torch.equal(q.scale[hf_rows], lay["qscale"][rsel])):
            raise ConfigError([f"pipeline.export_hf: re-quantizing {hf} (model dtype {dtype}) does not reproduce "
                               f"the artifact's {n}; expected the artifact of the model loaded from this folder"])
    return q.data, q.scale


def _hf_tensors(hf: str, src_t: torch.Tensor, pieces, layers: dict, fmt: str, shapes: dict,
                shared: dict | None = None, dtype: torch.dtype | None = None):
    """({name: tensor} to write for on-disk weight `hf`, quantized?) — packed when every piece is a quantized
    linear and they share one global scale (`shared`: the group's P and g, re-quantizing with P where a
    piece's own p differs), else dense with synodic's values in the source dtype."""
    names = [n[: -len(".weight")] for n, _, _ in pieces]
    quant = [n in layers for n in names]
    if not any(quant):
        return {hf: src_t}, False
    # each piece: synodic linear n, its rows rsel, and the on-disk rows hf_rows they land in
    placed = [(n, torch.arange(shapes[pname][0])[rows if rows is not None else slice(None)], hf_rows)
              for (pname, rows, hf_rows), n in zip(pieces, names)]
    if shared is not None:
        mod = hf[: -len(".weight")]
        if shared["requantize"]:  # every member, so that the max-scale one checks the inputs against the artifact
            packed, scale = _requantize(hf, src_t, placed, layers, shared["p"], dtype or src_t.dtype)
        else:
            packed, scale = _place(src_t, placed, layers)
        return {f"{mod}.weight_packed": packed.contiguous(),
                f"{mod}.weight_scale": scale.view(torch.float8_e4m3fn).contiguous(),
                f"{mod}.weight_global_scale": shared["g"].reshape(1).clone()}, True
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
        packed, scale = _place(src_t, placed, layers)
        try:
            g = global_scale(fmt, scale, layers[names[0]]["qtensor_scale"])
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


def _place(src_t: torch.Tensor, placed, layers: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The artifact's packed codes and block scales of every piece, in the on-disk row order."""
    first = layers[placed[0][0]]
    packed = first["qdata"].new_empty((src_t.shape[0], first["qdata"].shape[1]))
    scale = first["qscale"].new_empty((src_t.shape[0], first["qscale"].shape[1]))
    for n, rsel, hf_rows in placed:
        packed[hf_rows] = layers[n]["qdata"][rsel]
        scale[hf_rows] = layers[n]["qscale"][rsel]
    return packed, scale


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
    Returns {out, format, quantized: [on-disk modules], dense: [...], ignore: [...], shared_scale: {group:
    {members, p, requantized}}, vllm_fused_scale_mismatch: [groups written with differing global scales]}."""
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
    groups = shared_scales(rows, layers, fmt)
    member_of = {m + ".weight": key for key, gr in groups.items() for m in gr["members"]}
    # RTN re-quantizes the weights synodic quantized: the folder's tensors in the model's dtype (the manifest's
    # model.dtype when pipeline=quantize wrote it, else the folder's own)
    name = manifest.get("model", {}).get("dtype")
    dtype = getattr(torch, name) if name in ("float32", "bfloat16", "float16") else None
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
                        shared = groups.get(member_of.get(k, ""))
                        got, q = _hf_tensors(k, t, rows[k], layers, fmt, shapes, shared, dtype)
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
        log.warning("export_hf: %d fused groups (e.g. %s) have different NVFP4 global scales per projection "
                    "(no one global scale decodes every block scale of the shared p): compressed-tensors decodes "
                    "them exactly, vLLM keeps one global scale per fused layer", len(split), split[0])
    requant = sum(len(g["requantize"]) for g in groups.values())
    if requant:
        log.info("export_hf: %d fused groups share one NVFP4 global scale; %d modules re-quantized with it "
                 "(synodic's own artifact keeps per-linear scales)", len(groups), requant)
    return {"out": str(out), "format": CT_FORMATS[fmt], "quantized": sorted(quantized), "dense": sorted(dense),
            "ignore": cfg["quantization_config"]["ignore"], "vllm_fused_scale_mismatch": split,
            "shared_scale": {k: {"members": g["members"], "p": float(g["p"]), "requantized": g["requantize"]}
                             for k, g in sorted(groups.items())}}


def fused_scale_mismatch(global_scales: dict[str, float]) -> list[str]:
    """Fused groups ('<parent>.qkv', '<parent>.gate_up', ...) whose members' weight_global_scale differ."""
    groups: dict[str, set[float]] = {}
    for mod, g in global_scales.items():
        key = _fused_group(mod)
        if key is not None:
            groups.setdefault(key, set()).add(g)
    return sorted(k for k, v in groups.items() if len(v) > 1)
