"""quant=<format>: options compose and validate (mode vs the format's width, one line), build swaps the
blocks' linears for QuantLinear (lm_head kept), the scheme says what was done and that the CPU run is
emulated, the ledger reads packed bytes; report.layer_errors / plot_layer_errors."""
import pytest
import torch
from torch import nn

from synodic.config import ConfigError
from synodic.config.compose import compose
from synodic.graph import BuildContext, linear_weight_bytes
from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.quant import FORMATS, QuantLinear
from synodic.quant import linear as qlinear
from synodic.quant.config import FORMAT_BITS, MODES, BlockQuant


@pytest.fixture(autouse=True)
def _store(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(tmp_path / "store"))


def tiny():
    return random_model(PRESETS["tiny_mamba2"], 0)


def test_tables_mirror_the_quant_package():
    assert FORMAT_BITS == {k: f.elem.bits for k, f in FORMATS.items()}
    assert MODES == qlinear.MODES


@pytest.mark.parametrize("fmt", sorted(FORMAT_BITS))
def test_every_format_composes_with_its_width(fmt):
    cfg = compose([f"quant={fmt}"])
    assert cfg.quant.kind == fmt and cfg.quant.method == "dualquant" and cfg.quant.iters == 15
    assert cfg.quant.resolved_mode == f"w{FORMAT_BITS[fmt]}a16" and not cfg.quant.act_quant


@pytest.mark.parametrize("overrides,needle", [
    (["quant=mxfp4", "quant.mode=w8a8"], "quant.mode='w8a8': mxfp4 stores 4-bit weights; expected mode w4a16 or w4a4"),
    (["quant=mxfp8_e4m3", "quant.mode=w4a4"], "expected mode w8a16 or w8a8"),
    (["quant=nvfp4", "quant.method=gptq"], "quant.method='gptq'"),
    (["quant=nvfp4", "quant.alpha=1.5"], "quant.alpha=1.5"),
])
def test_bad_quant_one_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert any(needle in line for line in e.value.lines), e.value.lines
    assert len(e.value.lines) == 1


def test_build_swaps_block_linears_and_describes_itself():
    model = tiny()
    x = torch.randint(0, 4096, (2, 9))
    y0 = model(x)
    dense = linear_weight_bytes(model)
    q = BlockQuant(kind="mxfp4", method="dualquant", iters=2, mode="w4a4", artifact="none")
    scheme = q.build(BuildContext(model=model, device=torch.device("cpu"), max_slots=1, max_seq_len=16))
    quantized = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert quantized == set(scheme.layers) and all(n.startswith("blocks.") for n in quantized)
    assert linears == {"lm_head"}  # only the head stays in high precision
    s = scheme.summary()
    assert s["emulated"] is True and "CPU" in s["emulation"] and s["source"] == "on_the_fly"
    assert s["mode"] == "w4a4" and s["act_quant"] and s["n_layers"] == 24 and 0 < s["rel_mse_mean"] < 0.05
    assert s["weight_bytes"] < s["dense_bytes"] / 6  # fp32 -> 4.25 bits (+ s)
    # the ledger counts what a step reads: on the CPU the dense fallback reads the dequantized weights,
    # through the packed kernel (backend triton) the codes + scales
    qls = [m for m in model.modules() if isinstance(m, QuantLinear)]
    s_bytes = sum(4 * m.act_scale.numel() for m in qls if m.act_scale is not None)
    assert linear_weight_bytes(model) == dense + s_bytes
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.backend = "triton"
    assert linear_weight_bytes(model) == dense - s["dense_bytes"] + s["weight_bytes"]
    for m in qls:  # the forward on CPU tensors: the torch path (a GPU machine runs no interpreter)
        m.backend = "auto"
    y1 = model(x)  # W4A4 on a random model: a loose sanity bound only
    assert torch.isfinite(y1).all() and ((y1 - y0).norm() / y0.norm()).item() < 0.8


def test_build_without_dense_copy():
    """quant.dense_copy=false: the resident weights are the packed bytes, the output that of the dense copy."""
    x = torch.randint(0, 4096, (2, 9))
    ys, schemes = [], []
    for keep in (True, False):
        model = tiny()
        q = BlockQuant(kind="nvfp4", method="rtn", artifact="none", dense_copy=keep)
        schemes.append(q.build(BuildContext(model=model, device=torch.device("cpu"), max_slots=1, max_seq_len=16)))
        ys.append(model(x))
        assert all(m.dense is keep for m in model.modules() if isinstance(m, QuantLinear))
    kept, lean = schemes
    assert lean.resident_bytes == lean.weight_bytes and not lean.dense_copy
    assert kept.resident_bytes == kept.weight_bytes + kept.dense_bytes and kept.dense_copy
    assert "resident" in lean.line() and "dense copy kept" in kept.line() and "per call" in lean.emulation
    assert torch.equal(ys[0], ys[1])
    assert compose(["quant=mxfp4", "quant.dense_copy=false"]).quant.dense_copy is False


@pytest.mark.parametrize("fmt,device,dtype,backend,rows,keep", [
    ("nvfp4", "cuda", torch.bfloat16, "auto", 8, False),      # batch 1 x a window of 8: every call packed
    ("nvfp4", "cuda", torch.bfloat16, "auto", 32, False),
    ("nvfp4", "cuda", torch.bfloat16, "auto", 33, True),      # batch 32 with a window: the copy serves it
    ("mxfp4", "cuda", torch.float16, "auto", 32, False),
    ("mxfp8_e4m3", "cuda", torch.bfloat16, "auto", 16, False),
    ("mxfp8_e4m3", "cuda", torch.bfloat16, "auto", 17, True),  # MXFP8's kernel stops at 16 rows
    ("nvfp4", "cuda", torch.float32, "auto", 1, False),       # fp32 activations: the GEMV only
    ("nvfp4", "cuda", torch.float32, "auto", 2, True),
    ("nvfp4", "cpu", torch.bfloat16, "auto", 1, True),        # no packed kernel on the CPU
    ("nvfp4", "cuda", torch.bfloat16, "torch", 1, True),
    ("int4_g64", "cuda", torch.bfloat16, "auto", 1, True),    # no packed kernel for the format
])
def test_dense_copy_auto_keeps_it_only_where_a_decode_call_reads_it(fmt, device, dtype, backend, rows, keep):
    """quant.dense_copy=auto drops the copy exactly where every decode call runs the packed kernel with or without
    it (uses_kernel's rule with the copy), so decode is unchanged and only memory moves."""
    got, why = qlinear.dense_copy_pays(fmt, device, dtype, backend, rows)
    assert got is keep and why
    if device == "cuda" and backend == "auto" and fmt in qlinear.KERNEL_MAX_ROWS:
        layer = QuantLinear(torch.randn(32, 64), None, mode=f"w{FORMAT_BITS[fmt]}a16", fmt=fmt, dense=True)
        fake = type("X", (), {"is_cuda": True, "dtype": dtype, "numel": lambda self: rows * 64})()
        assert layer.uses_kernel(fake) is (not keep)  # the copy is dropped only where the kernel serves the call


def test_dense_copy_auto_is_the_default_and_reported():
    assert compose(["quant=nvfp4"]).quant.dense_copy == "auto"
    assert compose(["quant=nvfp4", "quant.dense_copy=true"]).quant.dense_copy is True
    model = tiny()
    scheme = BlockQuant(kind="nvfp4", method="rtn", artifact="none").build(
        BuildContext(model=model, device=torch.device("cpu"), max_slots=4, max_seq_len=16, window=8))
    assert scheme.dense_copy and "auto: on cpu" in scheme.line() and scheme.summary()["dense_copy_why"]
    assert all(m.dense for m in model.modules() if isinstance(m, QuantLinear))
    with pytest.raises(ConfigError) as e:
        compose(["quant=nvfp4", "quant.dense_copy=maybe"])
    assert len(e.value.lines) == 1 and "quant.dense_copy='maybe'" in e.value.lines[0] and "auto" in e.value.lines[0]


def test_layer_patterns_mxfp6_and_smoothquant():
    model = tiny()
    q = BlockQuant(kind="mxfp6_e2m3", method="smoothquant", layers=["blocks.*.mixer.up_proj", "lm_head"],
                   calib_samples=2, calib_len=16, artifact="none")
    scheme = q.build(BuildContext(model=model, device=torch.device("cpu"), max_slots=1, max_seq_len=16))
    assert scheme.layers[-1] == "lm_head" and all(n.endswith("up_proj") for n in scheme.layers[:-1])
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.mode == "w6a16"
    assert model.blocks[1].mixer.up_proj.act_scale is not None  # smoothing scales from calibration
    with pytest.raises(ConfigError, match="matched no quantizable"):
        BlockQuant(kind="nvfp4", layers=["nothing.*"]).build(
            BuildContext(model=tiny(), device=torch.device("cpu"), max_slots=1, max_seq_len=16))


def test_report_errors_and_plot(tmp_path):
    from synodic.quant.report import error_rows, layer_errors, plot_layer_errors
    model = tiny()
    with torch.no_grad():  # uneven input channels, where DualQuant's column scales pay off (docs/quantization.md)
        cols = torch.randn(384, generator=torch.Generator().manual_seed(0))
        model.blocks[0].mixer.in_proj.weight.mul_(torch.exp(cols))
    layers = ["blocks.0.*", "blocks.1.*"]
    rtn = layer_errors(model, "mxfp4", method="rtn", layers=layers)
    dq = layer_errors(model, {"kind": "mxfp4", "layers": layers}, iters=3)
    assert list(rtn) == ["blocks.0.mixer.in_proj", "blocks.0.mixer.out_proj", "blocks.1.mixer.up_proj",
                         "blocks.1.mixer.down_proj"]
    assert dq["blocks.0.mixer.in_proj"] < 0.8 * rtn["blocks.0.mixer.in_proj"]
    assert all(0 < v < 0.03 for v in (*rtn.values(), *dq.values()))
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # model untouched
    rows = error_rows({"rtn": rtn, "dualquant": dq})
    assert rows[0]["layer"] == "blocks.0.mixer.in_proj" and set(rows[0]) == {"layer", "rtn", "dualquant"}
    path = plot_layer_errors({"rtn": rtn, "dualquant": dq}, tmp_path / "err.png")
    assert path.stat().st_size > 1000
