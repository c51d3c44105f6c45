"""`quant` group: post-training quantization schemes for the model's linears.

    quant=none                      weights and activations in the model dtype
    quant=<format>                  mxfp4 | mxfp6_e2m3 | mxfp6_e3m2 | mxfp8_e4m3 | mxfp8_e5m2 | mxint8 |
                                    nvfp4 | int4_g64, with quant.method / quant.mode / ... (BlockQuant)

Building a BlockQuant swaps the selected `nn.Linear` modules for `QuantLinear` (synodic/quant/apply.py),
from the quantize pipeline's stored checkpoint when there is one for this model and config, else by
solving on the fly. No torch import here: configs validate without it.
"""

from typing import Literal

from pydantic import Field, field_validator

from synodic.config.registry import Component, register

# Element bits per format (mirrors synodic.quant.formats.FORMATS, which needs torch; a test checks it).
FORMAT_BITS = {"mxfp4": 4, "mxfp6_e2m3": 6, "mxfp6_e3m2": 6, "mxfp8_e4m3": 8, "mxfp8_e5m2": 8, "mxint8": 8,
               "nvfp4": 4, "int4_g64": 4}
# mode -> (weight bits, activations quantized); mirrors synodic.quant.linear.MODES.
MODES = {"w4a16": (4, False), "w4a4": (4, True), "w6a16": (6, False), "w6a6": (6, True),
         "w8a16": (8, False), "w8a8": (8, True)}


@register("quant")
class NoQuant(Component):
    """Weights and activations in the model dtype."""

    kind: Literal["none"] = "none"

    def build(self, ctx):
        return None


@register("quant")
class BlockQuant(Component):
    """Block-quantized linears (docs/quantization.md): weights stored in the format; activations either kept in the
    model dtype (wNa16) or fake-quantized to the same format after the multiply by s (wNaN)."""

    kind: Literal[tuple(FORMAT_BITS)]  # type: ignore[valid-type]
    method: Literal["rtn", "smoothquant", "dualquant"] = Field(
        "dualquant", description="rtn: plain cast; smoothquant: calibrated per-channel smoothing; "
        "dualquant: calibration-free dual scaling (docs/quantization.md)")
    mode: Literal[tuple(MODES)] | None = Field(  # type: ignore[valid-type]
        None, description="wNaM: N = weight bits, must equal the format's; a16 = weight-only, aN = "
        "activations fake-quantized to the format too; null = weight-only at the format's width")
    iters: int = Field(15, ge=0, le=10_000, description="DualQuant coordinate-descent rounds")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="SmoothQuant migration strength (0: all on the "
                         "activations, 1: all on the weights)")
    rule: Literal["floor", "rceil"] = Field("floor", description="E8M0 scale rule of the MX formats: floor "
                                            "(OCP spec) or rceil (torchao / cuBLAS inference)")
    layers: list[str] = Field(["blocks.*"], min_length=1, description="fnmatch patterns over nn.Linear module "
                              "names; default every linear projection of the blocks (lm_head only when named "
                              "exactly; embeddings and norms are not linears and are never quantized)")
    calib_samples: int = Field(16, ge=1, le=4096, description="SmoothQuant calibration sequences (train-split stdlib "
                               "documents, never the held-out shard)")
    calib_len: int = Field(128, ge=8, le=8192, description="tokens per SmoothQuant calibration sequence")
    artifact: str = Field("auto", description="auto: load the quantize pipeline's checkpoint for this model + "
                          "config from the store (outputs/quant_store, or $SYNODIC_QUANT_STORE) if present, "
                          "else quantize on the fly; none: always on the fly; or a store / artifact directory")
    backend: Literal["auto", "torch", "triton"] = Field("auto", description="QuantLinear forward: auto = packed "
                                                         "Triton kernel on CUDA where it applies, else torch")
    dense_copy: bool | Literal["auto"] = Field(
        "auto", description="true: keep each weight's dequantized copy resident beside the packed one (the packed "
        "kernel serves decode steps where it beats the bf16 linear: up to 32 rows MXFP4 / NVFP4, 16 rows MXFP8; "
        "larger batches and prefill run the dense matmul on the copy); false: weights resident at the format's "
        "width only, the packed kernel takes up to 128 rows and larger calls dequantize the weight per call; "
        "auto: no copy where every decode call (runtime.max_slots x the verify window rows) runs the packed "
        "kernel anyway (CUDA, up to 32 / 16 rows), else true")

    @field_validator("mode")
    @classmethod
    def _mode_matches_format(cls, v, info):
        kind = info.data.get("kind")
        if v is None or kind not in FORMAT_BITS:
            return v
        bits = FORMAT_BITS[kind]
        if MODES[v][0] != bits:
            fits = " or ".join(m for m, (b, _) in MODES.items() if b == bits)
            raise ValueError(f"{kind} stores {bits}-bit weights; expected mode {fits}")
        return v

    @property
    def bits(self) -> int:
        return FORMAT_BITS[self.kind]

    @property
    def resolved_mode(self) -> str:
        return self.mode or f"w{self.bits}a16"

    @property
    def act_quant(self) -> bool:
        return MODES[self.resolved_mode][1]

    def method_opts(self) -> dict:
        """Options of the method beyond the format (act_absmax for SmoothQuant comes from calibration)."""
        if self.method == "dualquant":
            return {"iters": self.iters, "rule": self.rule}
        if self.method == "smoothquant":
            return {"alpha": self.alpha, "rule": self.rule}
        return {"rule": self.rule}

    def artifact_key(self) -> dict:
        """What decides the stored weights (not the mode: weight-only and W4A4 share one checkpoint)."""
        key = {"format": self.kind, "method": self.method, "layers": list(self.layers), **self.method_opts()}
        if self.method == "smoothquant":
            key.update(calib_samples=self.calib_samples, calib_len=self.calib_len)
        return key

    def build(self, ctx):
        from synodic.quant.apply import apply_quant
        cfg, why = self, None
        if self.dense_copy == "auto":  # decided by what the graph serves: its slots and verify window
            from synodic.quant.linear import dense_copy_pays
            dtype = next(ctx.model.parameters()).dtype
            keep, why = dense_copy_pays(self.kind, ctx.device.type, dtype, self.backend, ctx.max_slots * ctx.window)
            cfg = self.model_copy(update={"dense_copy": keep})
        scheme = apply_quant(ctx.model, cfg, ctx.device)
        if why is not None:
            scheme.dense_copy_why = f"auto: {why}"
        print(scheme.line(), flush=True)
        return scheme
