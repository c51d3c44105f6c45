"""The plane-layout GEMM (KERNEL 'kgemm', kgemm.py over kmajor.py): the layout round trip and its slot rule, the
kernel vs the torch reference for every format on odd shapes (M not a multiple of the tile, N not of BLOCK_N, K
not of the group: padding and x masks), both orientations, split K summed in-kernel and by the host, with and
without the fused s multiply and bias, NVFP4's tensor scale; the config checks and the tuned section lookup."""
import json

import pytest
import torch
from kernel_errors import rel_rmse
from quant_cases import FORMATS, make
from synodic.kernels.quant_linear import KMajorWeight, kgemm_ref, pack_kmajor, quant_linear, unpack_kmajor
from synodic.kernels.quant_linear import tuned as tuned_mod
from synodic.kernels.quant_linear.kgemm_launch import kgemm_default_config, kgemm_split, resolve_kgemm_config
from synodic.kernels.quant_linear.kmajor import R_SHIFT, codes_per_word, dequant_kmajor

from synodic.quant import quantize
from synodic.quant.qtensor import dequantize


@pytest.mark.parametrize("fmt", FORMATS)
def test_kmajor_round_trip_and_slots(fmt):
    """unpack(pack(q)) is q; K pads to the group with zero codes and 1.0 scales; word row g * B + i, slot j holds
    the code of k = g * E * B + j * B + i; the planes decode to dequantize(q)."""
    N, K = 5, {"mxfp4": 288, "nvfp4": 144}.get(fmt, 160)  # one group and a partial one
    w, _, _, _ = make(N, K, 1, 0)
    q = quantize(w, fmt)
    g = pack_kmajor(q)
    back = unpack_kmajor(g)
    assert torch.equal(back.data, q.data) and torch.equal(back.scale, q.scale) and back.shape == q.shape
    E, B = codes_per_word(fmt), q.spec.block
    assert g.KP == 2 * E * B and g.words.shape == (g.KP // E, N) and g.factors.shape == (g.KP // (2 * B), N)
    assert (g.scale_codes()[K // B:] == (0x38 if fmt == "nvfp4" else 127)).all()
    # factor row g * E/2 + p: blocks g * E + p (low bf16) and g * E + p + E/2 (high), scale * 2^(R - 64)
    f = g.factors.to(torch.int64) & 0xFFFFFFFF
    bf = lambda bits: torch.tensor(bits.tolist(), dtype=torch.int16).view(torch.bfloat16).float()  # noqa: E731
    sh = 2.0 ** (R_SHIFT[fmt] - 64)
    for grp, p in ((0, 0), (1, E // 2 - 1)):
        lo, hi = f[grp * E // 2 + p] & 0xFFFF, f[grp * E // 2 + p] >> 16
        assert torch.equal(bf(lo.to(torch.int16)), g.block_factors()[grp * E + p] * sh)
        assert torch.equal(bf(hi.to(torch.int16)), g.block_factors()[grp * E + p + E // 2] * sh)
    assert torch.equal(g.scale_codes()[:K // B].t(), q.scale)
    codes = torch.nn.functional.pad(q.codes(), (0, g.KP - K)).to(torch.int64)
    words = g.words.to(torch.int64) & 0xFFFFFFFF
    bits = 32 // E
    for grp, i, j in ((0, 0, 0), (0, 3, 1), (0, B - 1, E - 1), (1, 2, E // 2), (1, 0, E - 1)):
        slot = (words[grp * B + i] >> (bits * j)) & ((1 << bits) - 1)
        assert torch.equal(slot, codes[:, grp * E * B + j * B + i])
    assert torch.equal(dequant_kmajor(g), dequantize(q))
    assert g.nbytes() == g.words.numel() * 4 + g.factors.numel() * 4 + (4 if fmt == "nvfp4" else 0)
    with pytest.raises(ValueError, match="q.fmt='int4_g64'"):
        pack_kmajor(quantize(torch.randn(4, 64), "int4_g64"))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_kmajor_extreme_scale_codes(fmt):
    """E8M0 codes 0 (2^-127), 1, 127, 192 (2^65, the largest the bf16 factor holds) and 255 (NaN) survive the
    factor packing; the planes decode them as dequantize does."""
    from synodic.quant.qtensor import QTensor
    q = quantize(torch.randn(5, 256), fmt)
    sc = q.scale.clone()
    sc[:, :5] = torch.tensor([0, 1, 127, 192, 255], dtype=torch.uint8)
    q = QTensor(q.fmt, q.data, sc, q.tensor_scale, q.shape)
    g = pack_kmajor(q)
    assert torch.equal(unpack_kmajor(g).scale, sc)
    ref, got = dequantize(q), dequant_kmajor(g)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())


CASES = [  # fmt, N, K, M, has_s, has_bias, config (None: the heuristic)
    ("mxfp4", 40, 96, 3, True, True, None),  # K padded to the 256-code group, x masked; N < BLOCK_N
    ("mxfp4", 48, 544, 17, False, True, dict(BLOCK_M=16, BLOCK_N=32, SPLIT_K=2)),  # 2 M tiles, in-kernel sum
    ("mxfp4", 32, 512, 5, True, False, dict(BLOCK_N=16, SWAP=1, SPLIT_K=2, SEM=False)),  # weight as A; host sum
    ("nvfp4", 72, 272, 17, True, True, dict(BLOCK_M=32, BLOCK_N=32, SWAP=1)),
    ("nvfp4", 33, 128, 2, False, False, dict(BLOCK_N=16)),
    ("mxfp8_e4m3", 33, 160, 2, True, True, dict(BLOCK_N=16, SPLIT_K=2)),
    ("mxfp8_e4m3", 24, 256, 9, False, True, dict(BLOCK_N=16, SWAP=1)),
    ("mxfp8_e5m2", 20, 128, 4, True, False, None),
]


@pytest.mark.parametrize("fmt,N,K,M,has_s,has_bias,config", CASES)
def test_kgemm_matches_ref(fmt, N, K, M, has_s, has_bias, config, device):
    w, x, s, b = make(N, K, M, N * K + M, device)
    s = s if has_s else None
    b = b if has_bias else None
    q = quantize(w, fmt)
    g = pack_kmajor(q)
    y_ref = quant_linear(x, q, s, b, backend="ref")  # the stored-layout reference: the layout cannot cancel out
    assert rel_rmse(kgemm_ref(x, g, s, b), y_ref) < 1e-6
    # fp32 activations: the interpreter's (and fp32's) IEEE dot, exact up to summation order
    y = quant_linear(x, g, s, b, backend="triton", config=config)
    assert y.shape == (M, N) and y.dtype == torch.float32 and rel_rmse(y, y_ref) < 1e-5
    if device == "cuda":  # bf16 operands, both decodes: x * s rounded to bf16 before the MMA
        for asm in (0, 1):
            y16 = quant_linear(x.bfloat16(), g, s, b, backend="triton", config=dict(config or {}, ASM=asm))
            ref16 = quant_linear(x.bfloat16(), q, s, b, backend="ref")
            assert y16.dtype == torch.bfloat16 and rel_rmse(y16, ref16) < 1e-2


def test_kgemm_batched_input_and_auto_backend():
    """x [..., K] keeps its leading dims; backend 'auto' on CPU is the reference."""
    w, x, s, b = make(24, 256, 6, 1)
    g = pack_kmajor(quantize(w, "mxfp4"))
    y = quant_linear(x.reshape(2, 3, 256), g, s, b, backend="triton")
    assert y.shape == (2, 3, 24) and rel_rmse(y.reshape(6, 24), kgemm_ref(x, g, s, b)) < 1e-5
    assert torch.equal(quant_linear(x, g, s, b), kgemm_ref(x, g, s, b))


def test_kgemm_config_checks_and_split():
    assert kgemm_default_config(2, 4096, 16, "mxfp4")["BLOCK_M"] == 16
    assert kgemm_default_config(200, 4096, 16, "mxfp4")["BLOCK_M"] == 128
    # 32 x 1 tiles on 132 SMs: split K up to 2 programs per SM, >= 4 groups a split
    assert kgemm_split(2, 4096, 16, 16, 128, 132) == 4
    assert kgemm_split(256, 14336, 56, 128, 256, 132) == 2  # 112 tiles: one split more fills the SMs
    assert kgemm_split(256, 14336, 56, 128, 128, 132) == 1
    with pytest.raises(ValueError, match="BLOCK_K"):
        resolve_kgemm_config(2, 64, 4, "mxfp4", dict(BLOCK_K=128))
    with pytest.raises(ValueError, match="BLOCK_M=24"):
        resolve_kgemm_config(2, 64, 4, "mxfp4", dict(BLOCK_M=24))
    with pytest.raises(ValueError, match="KERNEL='dotp'"):
        resolve_kgemm_config(2, 64, 4, "mxfp4", dict(KERNEL="dotp"))
    with pytest.raises(ValueError, match="SPLIT_K=0"):
        resolve_kgemm_config(2, 64, 4, "mxfp4", dict(SPLIT_K=0))
    assert isinstance(pack_kmajor(quantize(torch.randn(8, 64), "mxfp4")), KMajorWeight)


def test_kgemm_tuned_section(tmp_path):
    """The table's "kgemm" section is looked up by the GEMM row buckets, apart from any other section."""
    path = tmp_path / "NVIDIA_X.json"
    cfg = dict(BLOCK_M=16, BLOCK_N=64, SPLIT_K=2)
    path.write_text(json.dumps({"meta": {}, "configs": {}, "other": {"mxfp4,64,512,8": dict(BLOCK_M=32)},
                                "kgemm": {"mxfp4,64,512,8": cfg}}))
    tuned_mod.load.cache_clear()
    assert tuned_mod.lookup_gemm("NVIDIA X", "mxfp4", 64, 512, 5, root=tmp_path, section="kgemm") == cfg
    assert tuned_mod.lookup_gemm("NVIDIA X", "mxfp4", 64, 512, 5, root=tmp_path) == cfg  # "kgemm" by default
    assert tuned_mod.lookup_gemm("NVIDIA X", "mxfp4", 64, 512, 5, root=tmp_path, section="other") == dict(BLOCK_M=32)
    assert tuned_mod.lookup_gemm("NVIDIA X", "mxfp4", 64, 512, 300, root=tmp_path, section="kgemm") is None
    tuned_mod.load.cache_clear()


def test_quantlinear_kgemm_route(monkeypatch):
    """KGEMM_ROWS empty: no layer builds or routes to the plane layout. Listed: the layer builds it once (non-
    persistent buffers, resident bytes counted), its rows' weight reads are the plane layout's, and the kernel
    on it matches the layer's torch path; CPU inputs never route to it."""
    from synodic.quant import linear as lin
    w = torch.randn(40, 256)
    plain = lin.QuantLinear(w, torch.randn(40), mode="w4a16", fmt="mxfp4", dense=False)
    assert plain._kmajor is None and "kmajor_words" not in dict(plain.named_buffers())
    monkeypatch.setitem(lin.KGEMM_ROWS, "mxfp4", (2, 64))
    layer = lin.QuantLinear(w, torch.randn(40), mode="w4a16", fmt="mxfp4", dense=False)
    k = layer.kmajor()
    assert "kmajor_words" in dict(layer.named_buffers()) and "kmajor_words" not in layer.state_dict()
    back = unpack_kmajor(k)
    assert torch.equal(back.data, layer.qdata) and torch.equal(back.scale, layer.qscale)
    assert layer.kmajor().words is k.words  # built once
    assert layer.resident_bytes() == layer.packed_bytes() + k.nbytes()
    x = torch.randn(5, 256)
    assert not layer.uses_kgemm(x)  # CPU
    y = layer._kernel_forward(x, k)  # the kgemm path itself (interpreter)
    ref = lin.QuantLinear.forward(layer, x)  # CPU: the torch path on the dequantized weight
    assert rel_rmse(y, ref) < 1e-5
