"""The packed GEMM (KERNEL 'gemm') over the repacked weight: the repack round trip and layout, the kernel vs the
torch reference (dequantize + fp32 matmul) for every format on odd shapes (N not a multiple of the tile, K not of
the unit: padding), both orientations, split K with in-kernel and host reduction, the fused s multiply, bias and
NVFP4's tensor scale; the launch plan's checks and the tuned table's GEMM section."""
import json

import pytest
import torch
from kernel_errors import rel_rmse
from quant_cases import FORMATS, make
from synodic.kernels.quant_linear import quant_linear, repack, unrepack
from synodic.kernels.quant_linear import tuned as tuned_mod
from synodic.kernels.quant_linear.launch import gemm_default_config, resolve_gemm_config
from synodic.kernels.quant_linear.repack import unit_codes

from synodic.quant import quantize


@pytest.mark.parametrize("fmt", FORMATS)
def test_repack_round_trip_and_layout(fmt):
    """unrepack(repack(q)) is q; K pads to the unit with zero codes and 1.0 scales; byte j = 16 t + 4 c + 2 h + p
    of a unit holds unit-local k = 16 c + 8 h + 2 t + p (4-bit: low nibble; the high nibble k + 64)."""
    N, K = 5, {"mxfp4": 96, "nvfp4": 80}.get(fmt, 32)  # one unit, padded
    w, _, _, _ = make(N, K, 1, 0)
    q = quantize(w, fmt)
    g = repack(q)
    back = unrepack(g)
    assert torch.equal(back.data, q.data) and torch.equal(back.scale, q.scale) and back.shape == q.shape
    uc = unit_codes(fmt)
    assert g.KP == uc and g.K == K and g.scale.shape == (N, uc // q.spec.block)
    assert (g.scale[:, K // q.spec.block:] == (0x38 if fmt == "nvfp4" else 127)).all()
    codes = torch.nn.functional.pad(q.codes(), (0, uc - K))
    four = fmt in ("mxfp4", "nvfp4")
    for j in (0, 1, 2, 5, 16, 23, 37, 63):
        t, c, h, p = j // 16, (j // 4) % 4, (j // 2) % 2, j % 2
        kappa = 16 * c + 8 * h + 2 * t + p
        byte = g.data[:, j]
        if four:
            assert torch.equal(byte & 0xF, codes[:, kappa]) and torch.equal(byte >> 4, codes[:, 64 + kappa])
        else:
            assert torch.equal(byte, codes[:, kappa])
    assert g.nbytes() == g.data.numel() + g.scale.numel() + (4 if fmt == "nvfp4" else 0)
    with pytest.raises(ValueError, match="q.fmt='int4_g64'"):
        repack(quantize(torch.randn(4, 64), "int4_g64"))


CASES = [  # fmt, N, K, M, config (None: the heuristic)
    ("mxfp4", 40, 96, 2, None),  # K padded to the 128-code unit, x masked
    ("mxfp4", 72, 608, 17, dict(SWAP=0, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, SPLIT_K=3)),  # x as the MMA's A
    ("mxfp4", 64, 512, 3, dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=1)),  # 4 units per tile
    ("nvfp4", 72, 272, 17, None),
    ("nvfp4", 33, 256, 3, dict(SWAP=0, BLOCK_M=32, BLOCK_N=16, BLOCK_K=128, SPLIT_K=2, SEM=False)),  # host sum
    ("mxfp8_e4m3", 33, 160, 2, None),
    ("mxfp8_e4m3", 48, 256, 17, dict(SWAP=0, BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, SPLIT_K=4)),
    ("mxfp8_e5m2", 64, 512, 17, dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2)),
]


@pytest.mark.parametrize("fmt,N,K,M,config", CASES)
def test_gemm_matches_ref(fmt, N, K, M, config, device):
    w, x, s, b = make(N, K, M, N * K + M, device)
    q = quantize(w, fmt)
    g = repack(q)
    y_ref = quant_linear(x, q, s, b, backend="ref")
    # fp32 activations: the interpreter's (and fp32's) IEEE dot, exact up to summation order
    y = quant_linear(x, g, s, b, backend="triton", config=config)
    assert y.shape == (M, N) and y.dtype == torch.float32 and rel_rmse(y, y_ref) < 1e-5
    assert rel_rmse(quant_linear(x, g, s, b, backend="ref"), y_ref) == 0  # the reference un-repacks
    if device == "cuda":  # bf16 operands on the GPU: x * s rounded to bf16 before the MMA
        y16 = quant_linear(x.bfloat16(), g, s, b, backend="triton", config=config)
        assert y16.dtype == torch.bfloat16 and rel_rmse(y16, y_ref) < 1e-2


def test_gemm_without_s_and_bias_and_with_act_quant(device):
    """s and bias absent; W4A4 emulation: x quantized in torch before the weight-only GEMM."""
    w, x, s, _ = make(40, 256, 3, 1, device)
    q = quantize(w, "mxfp4")
    g = repack(q)
    assert rel_rmse(quant_linear(x, g, backend="triton"), quant_linear(x, q, backend="ref")) < 1e-5
    y = quant_linear(x[None], g, s, act_quant="mxfp4", backend="triton")
    assert y.shape == (1, 3, 40)
    assert rel_rmse(y[0], quant_linear(x, q, s, act_quant="mxfp4", backend="ref")) < 1e-5


def test_launch_plan():
    """The heuristic: weight on the MMA's wide side up to 64 rows, x above; BLOCK_K halved to divide the padded K;
    bad configs named."""
    small, big = gemm_default_config(8, 14336, 4096, "mxfp4"), gemm_default_config(256, 14336, 4096, "mxfp4")
    assert small["SWAP"] == 1 and small["BLOCK_M"] == 16 and big["SWAP"] == 0 and big["BLOCK_M"] == 128
    assert resolve_gemm_config(8, 14336, 4096, "mxfp4", None) == small
    c = resolve_gemm_config(3, 40, 384, "mxfp4", dict(BLOCK_K=512))
    assert c["BLOCK_K"] == 128 and 384 % c["BLOCK_K"] == 0
    with pytest.raises(ValueError, match="config TWO_MUL=True: not a gemm launch key"):
        resolve_gemm_config(3, 40, 384, "mxfp4", dict(TWO_MUL=True))
    with pytest.raises(ValueError, match="config BLOCK_K=64: expected a power of two in \\[128, 512\\]"):
        resolve_gemm_config(3, 40, 384, "nvfp4", dict(BLOCK_K=64))
    with pytest.raises(ValueError, match="config KERNEL='dotp': a repacked weight runs KERNEL='gemm'"):
        resolve_gemm_config(3, 40, 384, "nvfp4", dict(KERNEL="dotp"))
    with pytest.raises(ValueError, match="config SWAP=2"):
        resolve_gemm_config(3, 40, 384, "nvfp4", dict(SWAP=2))


def test_tuned_table_gemm_section(tmp_path):
    """The table's "gemm" section, by GEMM_M_BUCKETS (5..8 rows -> 8, above 256 none), apart from "configs"."""
    path = tmp_path / "T.json"
    entry = dict(KERNEL="gemm", BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, SWAP=1, SPLIT_K=2, num_warps=4, num_stages=4)
    path.write_text(json.dumps({"meta": {}, "configs": {"mxfp4,64,512,4": {"KERNEL": "dotp"}},
                                "gemm": {"mxfp4,64,512,8": entry}}))
    tuned_mod.load.cache_clear()
    try:
        assert tuned_mod.lookup_gemm("T", "mxfp4", 64, 512, 5, root=tmp_path) == entry
        assert tuned_mod.lookup_gemm("T", "mxfp4", 64, 512, 4, root=tmp_path) is None
        assert tuned_mod.lookup_gemm("T", "mxfp4", 64, 512, 300, root=tmp_path) is None
        assert tuned_mod.lookup("T", "mxfp4", 64, 512, 4, root=tmp_path) == {"KERNEL": "dotp"}
    finally:
        tuned_mod.load.cache_clear()
