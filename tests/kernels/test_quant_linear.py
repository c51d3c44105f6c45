"""quant_linear: the packed-weight Triton kernels vs the torch reference (dequantize + fp32 matmul) on odd
small shapes (N, K odd multiples of the block), rows M in {1, 2, 3, 5, 17, 20}, every kernel (tl.dot, the
CUDA-core GEMVs from code bytes and from int32 code words), split K with in-kernel and host reduction, the fused s
multiply and MXFP4 activation quantizer, bit-exact decoders; QuantLinear's kernel path vs its torch path."""
import pytest
import torch
import triton
import triton.language as tl
from kernel_errors import rel_rmse
from synodic.kernels.quant_linear import quant_linear
from synodic.kernels.quant_linear.codec import FMT_IDS, _decode, _e8m0
from synodic.kernels.quant_linear.dot import _bits8, _bits_hi, _bits_lo, _fold
from synodic.kernels.quant_linear.gemv32 import _pair32

from synodic.quant import QuantLinear, quantize


def make(N, K, M, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(K, generator=gen))  # uneven columns
    x = torch.randn(M, K, generator=gen).to(dtype).to(device)
    s = (torch.rand(K, generator=gen) + 0.5).to(device)
    b = torch.randn(N, generator=gen).to(device)
    return w.to(device), x, s, b


CASES = [  # fmt, N, K, M, dtype, act_quant, config
    ("mxfp4", 40, 96, 1, torch.float32, None, None),
    ("mxfp4", 40, 288, 5, torch.bfloat16, None, None),  # the M = 3..16 MXFP4 default: [64 x 256] tiles, K masked
    ("mxfp4", 136, 288, 20, torch.bfloat16, None, None),  # M = 17..32 below K = 8192: [64 x 256], N and K masked
    # the 17..32-row tile from K = 8192, [128 x 256] with 2 stages, forced at a small K
    ("mxfp4", 136, 288, 20, torch.bfloat16, None, dict(KERNEL="dotp", BLOCK_N=128, BLOCK_K=256, num_stages=2)),
    ("mxfp8_e4m3", 72, 160, 9, torch.bfloat16, None, None),  # M = 3..32: MXFP8 [64 x 128], 3 stages
    ("mxfp4", 136, 160, 40, torch.bfloat16, None, None),  # the M = 33..64 defaults: MXFP4 [128 x 64], N and K masked
    ("nvfp4", 72, 272, 40, torch.bfloat16, None, None),  # NVFP4 [64 x 256]
    ("mxfp4", 24, 160, 3, torch.float32, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 33, 96, 17, torch.bfloat16, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64)),
    ("nvfp4", 40, 112, 1, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=32)),
    ("nvfp4", 24, 160, 3, torch.bfloat16, "mxfp4", dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp8_e4m3", 24, 96, 3, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=64)),
    ("mxfp8_e5m2", 16, 96, 1, torch.float32, None, dict(BLOCK_N=16, BLOCK_K=32)),
]


@pytest.mark.parametrize("fmt,N,K,M,dtype,act,config", CASES)
def test_triton_matches_ref(fmt, N, K, M, dtype, act, config, device):
    w, x, s, b = make(N, K, M, dtype, device, seed=N * K + M)
    q = quantize(w, fmt)
    y = quant_linear(x, q, s, b, act_quant=act, backend="triton", config=config)
    y_ref = quant_linear(x, q, s, b, act_quant=act, backend="ref")
    assert y.shape == (M, N) and y.dtype == dtype and torch.isfinite(y).all()
    assert rel_rmse(y, y_ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_ref_is_dequantized_matmul():
    w, x, s, b = make(16, 64, 3, torch.float32, "cpu", 0)
    q = quantize(w, "nvfp4")
    from synodic.quant import dequantize, fake_quant
    want = fake_quant(x * s, "mxfp4") @ dequantize(q).T + b
    torch.testing.assert_close(quant_linear(x, q, s, b, act_quant="mxfp4", backend="ref"), want)


@pytest.mark.parametrize("mode,fmt", [("w4a16", "mxfp4"), ("w4a4", "nvfp4")])
def test_quantlinear_kernel_path(mode, fmt, device):
    w, x, _, _ = make(24, 96, 3, torch.float32, device, 7)
    ql = QuantLinear(w, None, mode=mode, fmt=fmt, method="dualquant", iters=2, backend="triton")
    ref = QuantLinear.from_packed(ql.qtensor(), ql.act_scale, None, mode=mode, backend="torch")
    assert ql.uses_kernel(x) and not ref.uses_kernel(x)
    assert rel_rmse(ql(x[None]), ref(x[None])) < 1e-5


def test_bad_input():
    w, x, s, _ = make(16, 64, 1, torch.float32, "cpu", 1)
    q = quantize(w, "mxfp4")
    with pytest.raises(ValueError, match="x: expected last dim K=64"):
        quant_linear(x[:, :32], q)
    with pytest.raises(ValueError, match="act_quant: expected None or 'mxfp4'"):
        quant_linear(x, q, act_quant="nvfp4")
    with pytest.raises(ValueError, match="the kernel reads"):
        quant_linear(x, quantize(w, "int4_g64"), backend="triton")


# --- MXFP8 (E4M3 / E5M2) weights: one code byte per weight, E8M0 scales of 32 ---------------------------------

FP8_SPECIAL = {  # codes planted in the weights: +-0, +-max magnitude, subnormals (E4M3 1..7, E5M2 1..3)
    "mxfp8_e4m3": [0x00, 0x80, 0x7E, 0xFE, 0x01, 0x81, 0x04, 0x07, 0x87, 0x08],
    "mxfp8_e5m2": [0x00, 0x80, 0x7B, 0xFB, 0x01, 0x81, 0x02, 0x03, 0x83, 0x04],
}


def fp8_weight(fmt, N, K, device, seed):
    """A quantized random weight with FP8_SPECIAL codes planted in every row (and a few small scales)."""
    from synodic.quant import QTensor
    w, _, _, _ = make(N, K, 1, torch.float32, "cpu", seed)
    q = quantize(w, fmt)
    data, scale = q.data.clone(), q.scale.clone()
    sp = torch.tensor(FP8_SPECIAL[fmt], dtype=torch.uint8)
    for n in range(N):
        cols = (torch.arange(len(sp)) * 7 + 3 * n) % K
        data[n, cols] = sp
    scale[::3, 0] = 100  # 2^-27: subnormal codes times it stay normal fp32
    return QTensor(fmt, data.to(device), scale.to(device), None, q.shape)


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty returns NaN-filled floating tensors: every output element must be written."""
    real = torch.empty

    def empty(*a, **kw):
        t = real(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def check_close(y, x, q, s):
    """Kernel vs reference, elementwise: |y - ref| <= 1e-5 * (|x s| @ |dequant(q)|.T) (fp32 reordering)."""
    from synodic.quant import dequantize
    y_ref = quant_linear(x, q, s, backend="ref")
    a = x.float() if s is None else x.float() * s
    bound = a.abs() @ dequantize(q).abs().T
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype and torch.isfinite(y).all()
    assert ((y - y_ref).abs() <= 1e-5 * bound + 1e-30).all()


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("N,K", [(5, 64), (5, 96), (48, 64), (48, 96)])
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("with_s", [False, True])
def test_fp8_triton_matches_ref(fmt, N, K, M, with_s, device, nan_empty):
    q = fp8_weight(fmt, N, K, device, seed=N + K)
    _, x, s, _ = make(N, K, M, torch.float32, device, seed=N * K + M)
    s = s if with_s else None
    config = dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=2) if K == 96 else None  # K=96: split K, partial sums
    y = quant_linear(x, q, s, backend="triton", config=config)
    check_close(y, x, q, s)


@triton.jit
def _fp8_dequant_kernel(c_ptr, sc_ptr, o_ptr, FMT: tl.constexpr):
    """256 codes in blocks of 32, one E8M0 scale each: the kernels' decoder times the block scale."""
    offs = tl.arange(0, 256)
    c = tl.load(c_ptr + offs).to(tl.int32)
    sc = tl.load(sc_ptr + offs // 32).to(tl.int32)
    tl.store(o_ptr + offs, _decode(c, FMT) * _e8m0(sc))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # max code * 2^127 -> inf, as wanted
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_fp8_decode_bit_exact(fmt, device):
    """Every code under E8M0 scales from 2^-127 to 2^127 and NaN: the kernel's decoder times the block scale
    equals dequantize(QTensor) bit for bit (NaN where it is NaN)."""
    from synodic.quant import QTensor, dequantize
    codes = torch.arange(256, dtype=torch.uint8, device=device)
    scale = torch.tensor([0, 1, 100, 127, 128, 200, 254, 255], dtype=torch.uint8, device=device)
    out = torch.full((256,), float("nan"), device=device)
    _fp8_dequant_kernel[(1,)](codes, scale, out, FMT=FMT_IDS[fmt])
    want = dequantize(QTensor(fmt, codes.reshape(8, 32), scale.reshape(8, 1), None, (8, 32))).reshape(-1)
    nan = want.isnan()
    assert (out.isnan() == nan).all()
    assert (out[~nan].view(torch.int32) == want[~nan].view(torch.int32)).all()


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_fp8_one_hot_rows_read_weights_exactly(fmt, device, nan_empty):
    """M = 64 one-hot rows (the largest tile) and M = 1 on one column: y is a column of dequant(q), exact."""
    from synodic.quant import dequantize
    N, K = 48, 64
    q = fp8_weight(fmt, N, K, device, seed=5)
    w = dequantize(q)
    eye = torch.eye(K, device=device)
    torch.testing.assert_close(quant_linear(eye, q, backend="triton"), w.T, rtol=0, atol=0)
    torch.testing.assert_close(quant_linear(eye[3:4], q, backend="triton"), w.T[3:4], rtol=0, atol=0)


def test_fp8_hardware_conversion_option(device):
    """config FP8_CVT=True (bitcast to tl.float8e4nv / tl.float8e5) in the tl.dot kernel, at M = 1 (asked
    for) and M = 3 (its default for MXFP8): runs, and agrees on finite codes."""
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
        q = fp8_weight(fmt, 5, 64, device, seed=3)
        _, x, s, _ = make(5, 64, 1, torch.float32, device, seed=4)
        check_close(quant_linear(x, q, s, backend="triton", config=dict(KERNEL="dot", FP8_CVT=True)), x, q, s)
        _, x3, s3, _ = make(5, 64, 3, torch.float32, device, seed=5)
        check_close(quant_linear(x3, q, s3, backend="triton"), x3, q, s3)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_fp8_quantlinear_kernel_path(fmt, device):
    from synodic.kernels.quant_linear import KERNEL_FORMATS
    assert fmt in KERNEL_FORMATS
    w, x, _, _ = make(24, 96, 1, torch.float32, device, 11)
    ql = QuantLinear(w, None, mode="w8a16", fmt=fmt, method="dualquant", iters=2, backend="triton")
    ref = QuantLinear.from_packed(ql.qtensor(), ql.act_scale, None, mode="w8a16", backend="torch")
    assert ql.uses_kernel(x) and not ref.uses_kernel(x)
    assert ql.weight_bytes(1) == ql.packed_bytes() == 24 * 96 + 24 * 3 + 96 * 4
    assert rel_rmse(ql(x), ref(x)) < 1e-5


# --- tl.dot for any M, the int32-word GEMV, in-kernel split-K ---------------------------------------------------------

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
V2_CASES = [  # fmt, N, K, M, dtype, act_quant, config
    ("mxfp4", 70, 160, 1, F32, None, dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 70, 160, 1, BF16, "mxfp4", dict(KERNEL="gemv32", BLOCK_N=32, BLOCK_K=128)),
    ("nvfp4", 40, 112, 1, F32, None, dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("mxfp8_e4m3", 24, 96, 1, F32, "mxfp4", dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 70, 224, 5, BF16, None, dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=64, SPLIT_K=3, SEM=False)),
    ("mxfp4", 70, 224, 20, F32, "mxfp4", dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=64, SPLIT_K=2, BLOCK_M=16)),  # M tiles
    ("nvfp4", 33, 160, 2, F16, None, dict(KERNEL="dot", BLOCK_N=32, BLOCK_K=64, SPLIT_K=2)),  # fp16: 2-mul decode
    ("mxfp4", 40, 96, 3, F32, None, dict(KERNEL="dot", TWO_MUL=True, SPLIT_K=2)),
    ("mxfp8_e5m2", 24, 96, 3, F32, None, dict(KERNEL="dot", BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
]


@pytest.mark.parametrize("fmt,N,K,M,dtype,act,config", V2_CASES)
def test_kernels_match_ref(fmt, N, K, M, dtype, act, config, device, nan_empty):
    from synodic.kernels.quant_linear.launch import _CNT
    w, x, s, b = make(N, K, M, dtype, device, seed=N * K + M + 1)
    q = quantize(w, fmt)
    y_ref = quant_linear(x, q, s, b, act_quant=act, backend="ref")
    for _ in range(2):  # twice: the split-K counters must be back at zero after a call
        y = quant_linear(x, q, s, b, act_quant=act, backend="triton", config=config)
        assert y.shape == (M, N) and y.dtype == dtype and torch.isfinite(y).all()
        assert rel_rmse(y, y_ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert all((t == 0).all() for t in _CNT.values())


@triton.jit
def _v2_dequant_kernel(c_ptr, sc_ptr, o_ptr, FMT: tl.constexpr, SH: tl.constexpr, SHMUL: tl.constexpr,
                       HI: tl.constexpr):
    """256 codes (bytes) in blocks of 32, one scale each: the v2 decoders times the folded block scale."""
    offs = tl.arange(0, 256)
    c = tl.load(c_ptr + offs).to(tl.int32)
    f = _fold(tl.load(sc_ptr + offs // 32).to(tl.int32), FMT, SH, SHMUL)
    if FMT <= 1:
        v = _bits_hi(c) if HI else _bits_lo(c)
    else:
        v = _bits8(c, FMT, False)
    tl.store(o_ptr + offs, v * f)


V2_SCALES = {  # block-scale codes inside the documented exact range (E8M0 2^-61 .. 2^65; any E4M3) + NaN
    "mxfp4": [66, 100, 127, 128, 150, 192, 255, 120],
    "nvfp4": [0x01, 0x08, 0x38, 0x7E, 0x30, 0x45, 0x7F, 0x11],
    "mxfp8_e4m3": [66, 100, 127, 128, 150, 192, 255, 120],
    "mxfp8_e5m2": [66, 100, 127, 128, 150, 192, 255, 120],
}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt,hi", [("mxfp4", False), ("mxfp4", True), ("nvfp4", False), ("nvfp4", True),
                                    ("mxfp8_e4m3", False), ("mxfp8_e5m2", False)])
def test_v2_decode_bit_exact(fmt, hi, device):
    """Every code byte (both nibbles of a 4-bit byte): decode * folded scale == dequantize() * 2^-64 bit for bit,
    NaN where it is NaN (the tl.dot path's weights; the accumulator is multiplied by 2^64 at the end)."""
    from synodic.kernels.quant_linear.dot import _DSH
    from synodic.kernels.quant_linear.launch import _code_shift

    from synodic.quant import QTensor, dequantize
    codes = torch.arange(256, dtype=torch.uint8, device=device)
    scale = torch.tensor(V2_SCALES[fmt], dtype=torch.uint8, device=device)
    r = _code_shift(fmt, False)
    out = torch.full((256,), float("nan"), device=device)
    _v2_dequant_kernel[(1,)](codes, scale, out, FMT=FMT_IDS[fmt], SH=r - _DSH, SHMUL=float(2.0 ** (r - _DSH)),
                             HI=hi)
    if fmt in ("mxfp4", "nvfp4"):  # each byte's nibble as one code: pack it as a byte's low nibble
        nib = (codes >> 4) if hi else (codes & 15)
        blk = 32 if fmt == "mxfp4" else 16
        data = nib.reshape(8, 32)[:, 0::2] | (nib.reshape(8, 32)[:, 1::2] << 4)
        sc = scale.reshape(8, 1).repeat(1, 32 // blk)
        q = QTensor(fmt, data, sc, torch.ones(1, device=device) if fmt == "nvfp4" else None, (8, 32))
    else:
        q = QTensor(fmt, codes.reshape(8, 32), scale.reshape(8, 1), None, (8, 32))
    want = (dequantize(q).double() * 2.0 ** -_DSH).float().reshape(-1)
    nan = want.isnan()
    assert (out.isnan() == nan).all()
    assert (out[~nan].view(torch.int32) == want[~nan].view(torch.int32)).all()


# --- gemv32: the one-row GEMV from int32 code words -------------------------------------------------------------

W32_CASES = [  # fmt, N, K, dtype, act_quant, with s and bias, config (KERNEL="gemv32" added)
    ("mxfp4", 37, 160, F32, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 37, 256, BF16, "mxfp4", True, dict(BLOCK_N=32, BLOCK_K=128)),  # split K from the heuristic
    ("mxfp4", 21, 128, F32, None, False, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=4, SEM=False)),  # host sums
    ("nvfp4", 41, 112, F32, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("nvfp4", 41, 96, BF16, "mxfp4", False, dict(BLOCK_N=32, BLOCK_K=64, SPLIT_K=2)),  # host act quant
    ("mxfp8_e4m3", 24, 96, F32, "mxfp4", True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("mxfp8_e5m2", 19, 128, F32, None, False, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
]


@pytest.mark.parametrize("fmt,N,K,dtype,act,with_sb,config", W32_CASES)
def test_gemv32_matches_ref(fmt, N, K, dtype, act, with_sb, config, device, nan_empty):
    check_kernel_matches_ref("gemv32", fmt, N, K, 1, dtype, act, with_sb, config, device, seed=N * K + 3)


def check_kernel_matches_ref(kernel, fmt, N, K, M, dtype, act, with_sb, config, device, seed):
    """KERNEL=kernel against the reference, twice (the split-K counters must be back at zero after a call)."""
    from synodic.kernels.quant_linear.launch import _CNT
    w, x, s, b = make(N, K, M, dtype, device, seed=seed)
    s, b = (s, b) if with_sb else (None, None)
    q = quantize(w, fmt)
    y_ref = quant_linear(x, q, s, b, act_quant=act, backend="ref")
    for _ in range(2):
        y = quant_linear(x, q, s, b, act_quant=act, backend="triton", config=dict(config, KERNEL=kernel))
        assert y.shape == (M, N) and y.dtype == dtype and torch.isfinite(y).all()
        assert rel_rmse(y, y_ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert all((t == 0).all() for t in _CNT.values())


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_gemv32_fp8_special_codes(fmt, device, nan_empty):
    """Planted zero / max / subnormal codes: elementwise within fp32 reordering of the reference."""
    q = fp8_weight(fmt, 5, 96, device, seed=9)
    _, x, s, _ = make(5, 96, 1, torch.float32, device, seed=10)
    check_close(quant_linear(x, q, s, backend="triton", config=dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=32,
                                                                       SPLIT_K=2)), x, q, s)


def test_gemv32_one_hot_rows_exact(device):
    """One-hot x: y is a column of dequant(q), bit for bit (4-bit: every nibble position of a word)."""
    from synodic.quant import dequantize
    w, _, _, _ = make(24, 64, 1, torch.float32, device, seed=12)
    q = quantize(w, "mxfp4")
    eye = torch.eye(64, device=device)
    for k in range(8):
        y = quant_linear(eye[k:k + 1], q, backend="triton", config=dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=64))
        torch.testing.assert_close(y, dequantize(q)[:, k][None], rtol=0, atol=0)


@triton.jit
def _pair32_kernel(w_ptr, o_ptr, FMT: tl.constexpr, E: tl.constexpr, NW: tl.constexpr):
    """NW code words -> their E decoded codes each, in k order (word w, code i at o[w * E + i])."""
    offs = tl.arange(0, NW)
    w = tl.load(w_ptr + offs)
    for j in tl.static_range(E // 2):
        lo, hi = _pair32(w, j, FMT)
        tl.store(o_ptr + offs * E + j, lo)
        tl.store(o_ptr + offs * E + j + E // 2, hi)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_gemv32_decode_bit_exact(fmt, device):
    """Every code byte at every byte position of a word: gemv32's decode == dequantize() * 2^-R bit for bit,
    NaN where it is NaN (E4M3 0x7F/0xFF, E5M2 NaN codes; E5M2 +-Inf kept)."""
    from synodic.kernels.quant_linear.launch import _code_shift, code_words

    from synodic.quant import QTensor, dequantize
    ar = torch.arange(256)
    data = ((ar[:, None] + 37 * torch.arange(4)[None, :]) % 256).to(torch.uint8).reshape(32, 32)  # word w: 4 bytes
    words = code_words(data.to(device)).reshape(-1)
    e = 8 if fmt == "mxfp4" else 4
    out = torch.full((256 * e,), 1.0, device=device)
    _pair32_kernel[(1,)](words, out, FMT=FMT_IDS[fmt], E=e, NW=256)
    k = 64 if fmt == "mxfp4" else 32
    q = QTensor(fmt, data.to(device), torch.full((32, k // 32), 127, dtype=torch.uint8, device=device), None, (32, k))
    want = (dequantize(q).double() * 2.0 ** -_code_shift(fmt, False)).float().reshape(-1)
    nan = want.isnan()
    assert (out.isnan() == nan).all()
    assert (out[~nan].view(torch.int32) == want[~nan].view(torch.int32)).all()


def test_gemv32_config_checks(device):
    """Rows > 1 take the tl.dot kernel; FP8_CVT is refused; a misaligned code buffer is read through a copy."""
    from synodic.quant import QTensor
    w, x, s, b = make(24, 96, 3, torch.float32, device, seed=13)
    q = quantize(w, "mxfp4")
    ref = quant_linear(x, q, s, b, backend="ref")
    assert rel_rmse(quant_linear(x, q, s, b, backend="triton", config=dict(KERNEL="gemv32")), ref) < 1e-5
    with pytest.raises(ValueError, match="FP8_CVT"):
        quant_linear(x[:1], quantize(w, "mxfp8_e4m3"), backend="triton", config=dict(KERNEL="gemv32", FP8_CVT=True))
    buf = torch.empty(q.data.numel() + 1, dtype=torch.uint8, device=device)
    data = buf[1:].view(q.data.shape)
    data.copy_(q.data)
    assert data.is_contiguous() and data.storage_offset() == 1
    q1 = QTensor(q.fmt, data, q.scale, None, q.shape)
    y = quant_linear(x[:1], q1, s, b, backend="triton", config=dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=32))
    assert rel_rmse(y, ref[:1]) < 1e-5


# --- dotp: tl.dot on bf16-decoded, K-permuted weight tiles (inline-asm decode on the GPU) ------------------------

DOTP_CASES = [  # fmt, N, K, M, dtype, act_quant, with s and bias, config (KERNEL="dotp" added)
    ("mxfp4", 37, 160, 1, F32, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=2)),
    ("mxfp4", 70, 224, 3, BF16, None, False, dict(BLOCK_N=32, BLOCK_K=64, SPLIT_K=3, SEM=False)),
    ("mxfp4", 33, 96, 17, F32, "mxfp4", True, dict(BLOCK_N=64, BLOCK_K=64)),
    ("mxfp4", 64, 256, 20, BF16, None, True, dict(BLOCK_N=32, BLOCK_K=128, BLOCK_M=16, SPLIT_K=2)),  # even tiles
    ("nvfp4", 41, 112, 1, F32, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("nvfp4", 24, 160, 5, F16, "mxfp4", False, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),  # fp16: fp32 operands
    ("mxfp8_e4m3", 24, 96, 1, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("mxfp8_e4m3", 40, 192, 2, F32, "mxfp4", False, dict(BLOCK_N=32, BLOCK_K=64)),
    ("mxfp8_e5m2", 19, 128, 1, F32, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp8_e5m2", 48, 64, 3, BF16, None, False, dict(BLOCK_N=16, BLOCK_K=64)),
]


@pytest.mark.parametrize("fmt,N,K,M,dtype,act,with_sb,config", DOTP_CASES)
def test_dotp_matches_ref(fmt, N, K, M, dtype, act, with_sb, config, device, nan_empty):
    check_kernel_matches_ref("dotp", fmt, N, K, M, dtype, act, with_sb, config, device, seed=N * K + M + 5)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_dotp_fp8_special_codes(fmt, device, nan_empty):
    """Planted zero / max / subnormal codes (finite ones: dotp reads NaN / Inf codes as finite)."""
    q = fp8_weight(fmt, 5, 96, device, seed=14)
    _, x, s, _ = make(5, 96, 3, torch.float32, device, seed=15)
    check_close(quant_linear(x, q, s, backend="triton", config=dict(KERNEL="dotp", BLOCK_N=16, BLOCK_K=32,
                                                                       SPLIT_K=2)), x, q, s)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_dotp_one_hot_rows_exact(fmt, dtype, device):
    """One-hot x (bf16: the MMA path on a GPU): y is a column of dequant(q) rounded to x's dtype, bit for bit, at
    every position of the permuted K tile (both nibbles, all k pairs / halves / 16-steps). NVFP4: within one
    rounding (its fp32 tensor scale multiplies the sum, not each weight as in dequantize)."""
    from synodic.quant import dequantize
    N, K = 24, 128
    q = fp8_weight(fmt, N, K, device, seed=16) if fmt.startswith("mxfp8") else \
        quantize(make(N, K, 1, torch.float32, device, seed=16)[0], fmt)
    eye = torch.eye(K, device=device, dtype=dtype)
    y = quant_linear(eye, q, backend="triton", config=dict(KERNEL="dotp", BLOCK_N=16, BLOCK_K=128))
    rtol = 0 if fmt != "nvfp4" else 2.0 ** -23 if dtype == F32 else 2.0 ** -7
    torch.testing.assert_close(y, dequantize(q).T.to(dtype), rtol=rtol, atol=0)


def test_dotp_config_checks(device):
    w, x, _, _ = make(16, 64, 1, torch.float32, device, seed=17)
    for cfg in (dict(FP8_CVT=True), dict(TWO_MUL=True), dict(BLOCK_M=8)):
        with pytest.raises(ValueError, match="dotp"):
            quant_linear(x, quantize(w, "mxfp8_e4m3"), backend="triton", config=dict(cfg, KERNEL="dotp"))


# --- tc: the plain tensor-core GEMM over the stored layout (x split into even / odd k in registers) --------------

TC_CASES = [  # fmt, N, K, M, dtype, act_quant, with s and bias, config (KERNEL="tc" added)
    ("mxfp4", 37, 160, 3, F32, None, True, dict(SWAP=1, BLOCK_N=16, BLOCK_M=16, SPLIT_K=2)),  # partial K step
    ("mxfp4", 70, 384, 20, BF16, None, False, dict(SWAP=0, BLOCK_N=32, BLOCK_M=16, SPLIT_K=3, SEM=False)),
    ("mxfp4", 33, 96, 17, F32, "mxfp4", True, dict(SWAP=0, BLOCK_N=16, BLOCK_M=32)),
    ("nvfp4", 41, 272, 5, BF16, None, True, dict(SWAP=1, BLOCK_N=32, BLOCK_M=16, SPLIT_K=2)),
    ("nvfp4", 24, 256, 40, F16, None, False, dict(SWAP=0, BLOCK_N=16, BLOCK_M=32)),  # fp16: fp32 operands
    ("mxfp8_e4m3", 24, 96, 2, BF16, None, True, dict(SWAP=1, BLOCK_N=16, BLOCK_M=16, SPLIT_K=2)),
    ("mxfp8_e5m2", 19, 192, 33, F32, None, True, dict(SWAP=0, BLOCK_N=16, BLOCK_M=16)),
]


@pytest.mark.parametrize("fmt,N,K,M,dtype,act,with_sb,config", TC_CASES)
def test_tc_matches_ref(fmt, N, K, M, dtype, act, with_sb, config, device, nan_empty):
    check_kernel_matches_ref("tc", fmt, N, K, M, dtype, act, with_sb, config, device, seed=N * K + M + 7)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("swap", [0, 1])
def test_tc_one_hot_rows_exact(fmt, swap, device):
    """One-hot x: y is a column of dequant(q), at every k of a step (both planes, every block); NVFP4 within one
    rounding (its tensor scale multiplies the sum)."""
    from synodic.quant import dequantize
    N, K = 24, 256
    q = fp8_weight(fmt, N, K, device, seed=18) if fmt.startswith("mxfp8") else \
        quantize(make(N, K, 1, torch.float32, device, seed=18)[0], fmt)
    eye = torch.eye(K, device=device, dtype=F32)
    y = quant_linear(eye, q, backend="triton", config=dict(KERNEL="tc", SWAP=swap, BLOCK_N=16, BLOCK_M=64))
    torch.testing.assert_close(y, dequantize(q).T, rtol=0 if fmt != "nvfp4" else 2.0 ** -23, atol=0)


def test_tc_config_checks(device):
    w, x, _, _ = make(16, 128, 1, torch.float32, device, seed=19)
    q = quantize(w, "mxfp4")
    for cfg, word in ((dict(BLOCK_K=64), "BLOCK_K=128"), (dict(SWAP=2), "SWAP 0 or 1"), (dict(BLOCK_M=8), "BLOCK_M")):
        with pytest.raises(ValueError, match=word):
            quant_linear(x, q, backend="triton", config=dict(cfg, KERNEL="tc"))
    with pytest.raises(ValueError, match="only KERNEL='tc'"):
        quant_linear(x, q, backend="triton", config=dict(KERNEL="dotp", SWAP=1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX: GPU only (the interpreter runs _dec_ref)")
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_dotp_asm_decode_matches_ref(fmt):
    """Every code byte at every byte position of an asm call: the inline-asm bf16 patterns == `_dec_ref`'s."""
    from synodic.kernels.quant_linear.dotp import _dec_asm, _dec_ref

    @triton.jit
    def kern(c_ptr, o_ptr, r_ptr, FMT: tl.constexpr):
        offs = tl.arange(0, 1024)
        c = tl.load(c_ptr + offs)
        if FMT <= 1:
            lo, hi = _dec_asm(c, FMT)
            rlo, rhi = _dec_ref(c, FMT)
            tl.store(o_ptr + 2 * offs, lo.to(tl.int16, bitcast=True))
            tl.store(o_ptr + 2 * offs + 1, hi.to(tl.int16, bitcast=True))
            tl.store(r_ptr + 2 * offs, rlo.to(tl.int16))
            tl.store(r_ptr + 2 * offs + 1, rhi.to(tl.int16))
        else:
            tl.store(o_ptr + offs, _dec_asm(c, FMT).to(tl.int16, bitcast=True))
            tl.store(r_ptr + offs, _dec_ref(c, FMT).to(tl.int16))

    ar = torch.arange(1024)
    codes = ((ar // 4 + 67 * (ar % 4)) % 256).to(torch.uint8).cuda()  # each byte value at each of the 4 positions
    out = torch.zeros(2048, dtype=torch.int16, device="cuda")
    ref = torch.ones(2048, dtype=torch.int16, device="cuda")
    kern[(1,)](codes, out, ref, FMT=FMT_IDS[fmt])
    n = 2048 if fmt == "mxfp4" else 1024
    assert torch.equal(out[:n], ref[:n])


# --- gemvh: the GEMV for 1-2 rows with fp16x2 arithmetic (inline asm on the GPU, fp32 sums of fp16 operands on CPU) ---

GH_CASES = [  # fmt, N, K, dtype, act_quant, with s and bias, config (KERNEL="gemvh" added)
    ("mxfp4", 37, 160, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 37, 256, F16, "mxfp4", True, dict(BLOCK_N=32, BLOCK_K=128)),  # split K from the heuristic
    ("mxfp4", 21, 128, F32, None, False, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=4, SEM=False)),  # host sums
    ("nvfp4", 41, 112, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("nvfp4", 41, 96, BF16, "mxfp4", False, dict(BLOCK_N=32, BLOCK_K=64, SPLIT_K=2)),  # host act quant
    ("mxfp8_e4m3", 24, 96, BF16, "mxfp4", True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3)),
    ("mxfp8_e4m3", 45, 192, F32, None, True, dict(BLOCK_N=16, BLOCK_K=64)),
    ("mxfp8_e5m2", 19, 128, BF16, None, False, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2)),
    ("mxfp4", 37, 192, BF16, None, True, dict(BLOCK_N=64, BLOCK_K=64, SPLIT_K=3, num_warps=4)),  # 4 warps
]


def test_config_keys_checked(device):
    w, x, _, _ = make(16, 64, 1, torch.float32, device, seed=18)
    with pytest.raises(ValueError, match="K_FIRST"):
        quant_linear(x, quantize(w, "mxfp4"), backend="triton", config=dict(KERNEL="gemvh", K_FIRST=True))
    with pytest.raises(ValueError, match="BLOCK_M"):
        quant_linear(x, quantize(w, "mxfp4"), backend="triton", config=dict(KERNEL="gemvh", BLOCK_M=4))
    with pytest.raises(ValueError, match="PREFETCH"):
        quant_linear(x, quantize(w, "mxfp4"), backend="triton", config=dict(KERNEL="dotp", PREFETCH=1))


def test_default_one_row_kernel_follows_activation_dtype():
    """One or two rows: gemvh (fp16 arithmetic) for bf16 / fp16 activations, gemv32 (fp32) for one fp32 row;
    more rows: dotp."""
    from synodic.kernels.quant_linear.launch import resolve_config
    assert resolve_config(1, 4096, 14336, "mxfp4", None)["KERNEL"] == "gemvh"
    assert resolve_config(2, 4096, 14336, "nvfp4", None)["BLOCK_M"] == 2
    assert resolve_config(3, 4096, 14336, "mxfp4", None)["KERNEL"] == "dotp"
    assert resolve_config(1, 4096, 14336, "mxfp8_e4m3", None)["BLOCK_K"] == 512
    assert resolve_config(2, 4096, 14336, "mxfp8_e4m3", None)["BLOCK_K"] == 256
    assert resolve_config(1, 4096, 14336, "mxfp4", None, fp32_act=True)["KERNEL"] == "gemv32"
    assert resolve_config(8, 4096, 14336, "mxfp4", None)["KERNEL"] == "dotp"
    assert resolve_config(1, 14336, 4096, "nvfp4", None)["PREFETCH"] == 1  # NVFP4: longer K loops, next tile in flight
    assert "PREFETCH" not in resolve_config(2, 14336, 4096, "nvfp4", None)
    assert resolve_config(2, 14336, 4096, "nvfp4", None)["num_warps"] == 1  # one-warp programs at M = 2
    assert resolve_config(2, 14336, 4096, "mxfp8_e4m3", None)["num_warps"] == 1
    assert resolve_config(2, 14336, 4096, "mxfp4", None)["num_warps"] == 4
    # dotp tiles by rows (_DOTP): MXFP4 [64 x 256] to 16 rows, to 32 [128 x 256] from K = 8192 and [64 x 256] (3
    # stages) below, [128 x 64] to 128 (4 stages to 64, 3 above); NVFP4 [64 x 128] to 32, [64 x 256] to 64,
    # [128 x 128] to 128; MXFP8 [64 x 128] to 32; a forced kernel above 128 rows the generic [64 x 128]
    tile = [(c["BLOCK_N"], c["BLOCK_K"], c["num_stages"]) for c in (
        resolve_config(m, n, k, "mxfp4", None) for m, n, k in ((17, 21504, 4096), (32, 4096, 8191), (32, 4096, 8192)))]
    assert tile == [(64, 256, 3), (64, 256, 3), (128, 256, 2)]
    assert [resolve_config(m, 4096, 14336, "mxfp4", None)["BLOCK_K"] for m in (16, 17, 33)] == [256, 256, 64]
    assert [resolve_config(m, 4096, 14336, "nvfp4", None)["BLOCK_K"] for m in (3, 32, 33, 65, 128, 129)] == [
        128, 128, 256, 128, 128, 128]
    assert [resolve_config(m, 4096, 14336, "nvfp4", None)["BLOCK_N"] for m in (64, 65, 128, 129)] == [64, 128, 128, 64]
    assert [resolve_config(m, 4096, 14336, "mxfp8_e4m3", None)["BLOCK_K"] for m in (3, 32, 33)] == [128, 128, 64]
    assert [resolve_config(m, 4096, 14336, "mxfp4", None)["BLOCK_N"] for m in (32, 33, 64, 65, 128, 129)] == [
        128, 128, 128, 128, 128, 64]
    assert [resolve_config(m, 4096, 14336, "mxfp4", None)["num_stages"] for m in (64, 65, 129)] == [4, 3, 4]
    assert resolve_config(48, 4096, 14336, "nvfp4", None)["BLOCK_K"] == 256
    # K splits: at M = 1 >= 2 K tiles a split unless < 2 programs per SM; NVFP4's dotp up to 6 programs per SM
    split = {(m, n, k, f): resolve_config(m, n, k, f, None)["SPLIT_K"] for m, n, k, f in (
        (1, 18560, 4096, "mxfp4"), (1, 4096, 8192, "mxfp4"), (1, 4096, 4096, "mxfp4"), (1, 4096, 14336, "mxfp4"),
        (4, 18560, 4096, "nvfp4"), (4, 18560, 4096, "mxfp4"))}
    assert list(split.values()) == [4, 8, 8, 16, 2, 1]


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3"])
def test_default_two_rows(fmt, device):
    """The M = 2 defaults (gemvh, both rows per program; one-warp programs for NVFP4 / MXFP8) over several K tiles,
    a partial last one and a partial last row tile."""
    w, x, s, b = make(45, 1056, 2, BF16, device, seed=1056 + len(fmt))
    q = quantize(w, fmt)
    check_fp16_close(quant_linear(x, q, s, b, backend="triton"), x, q, s, b, None)


@pytest.mark.parametrize("N,K", [(45, 1056), (64, 512)])
def test_nvfp4_default_one_row(N, K, device):
    """NVFP4's M = 1 default (gemvh with PREFETCH) over several K tiles, a partial last one, and the EVEN path."""
    w, x, s, b = make(N, K, 1, BF16, device, seed=N + K)
    q = quantize(w, "nvfp4")
    check_fp16_close(quant_linear(x, q, s, b, backend="triton"), x, q, s, b, None)


def check_fp16_close(y, x, q, s, b, act):
    """|y - ref| <= 4e-3 * (|act(x s)| @ |dequant(q)|.T) (+ one rounding of the output dtype): fp16 operands and
    fp16 partial sums of a word against the fp32 reference."""
    from synodic.quant import dequantize
    from synodic.quant.qtensor import fake_quant
    y_ref = quant_linear(x, q, s, b, act_quant=act, backend="ref").float()
    a = x.float() if s is None else x.float() * s
    if act is not None:
        a = fake_quant(a, act)
    bound = 4e-3 * (a.abs() @ dequantize(q).abs().T)
    if y.dtype != torch.float32:
        bound = bound + y_ref.abs() * 2.0 ** -7
    assert torch.isfinite(y).all()
    assert ((y.float() - y_ref).abs() <= bound + 1e-30).all()


GH_CASES += [  # several activation rows: one weight decode for 2 rows (M = 3: the last program's second row
    # masked; M = 6: three programs along M; M = 5 with one row per program)
    ("mxfp4", 37, 160, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2), 2),
    ("nvfp4", 41, 128, BF16, "mxfp4", True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=3), 3),
    ("mxfp8_e4m3", 24, 96, F16, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=2, SEM=False), 4),
    ("mxfp4", 21, 128, BF16, None, False, dict(BLOCK_N=16, BLOCK_K=64), 6),
    ("mxfp8_e5m2", 19, 128, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=64, BLOCK_M=1), 5),
]
GH_CASES += [  # PREFETCH: the next K tile loaded before this one is decoded; several tiles per split, a partial
    # last tile (K not a tile multiple), one split over all of K, the EVEN path, two rows
    ("mxfp4", 37, 352, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2, PREFETCH=1)),
    ("nvfp4", 41, 256, BF16, "mxfp4", False, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1, PREFETCH=1)),
    ("mxfp4", 32, 256, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=1, PREFETCH=1)),
    ("mxfp8_e4m3", 24, 224, BF16, None, True, dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=2, PREFETCH=1), 2),
]


@pytest.mark.parametrize("fmt,N,K,dtype,act,with_sb,config,M", [c if len(c) == 8 else c + (1,) for c in GH_CASES])
def test_gemvh_matches_ref(fmt, N, K, dtype, act, with_sb, config, M, device, nan_empty):
    from synodic.kernels.quant_linear.launch import _CNT
    w, x, s, b = make(N, K, M, dtype, device, seed=N * K + 7)
    s, b = (s, b) if with_sb else (None, None)
    q = quantize(w, fmt)
    big = 30.0 if dtype == F16 else 8e3  # an fp16 y must stay finite
    for scale in (1.0, big, 1e-5):  # block ranges: fp16 must neither overflow nor lose small activations
        xs = (x.float() * scale).to(dtype)
        for _ in range(2):  # the split-K counters must be back at zero after a call
            y = quant_linear(xs, q, s, b, act_quant=act, backend="triton", config=dict(config, KERNEL="gemvh"))
            assert y.shape == (M, N) and y.dtype == dtype
            check_fp16_close(y, xs, q, s, b, act)
    assert all((t == 0).all() for t in _CNT.values())


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_gemvh_one_hot_exact(fmt, device):
    """Every code byte at every byte position of a word, read through one-hot rows x = I (all K positions, two rows
    per program): y is dequant(q).T bit for bit. fp8: NaN rows wherever a NaN code sits in a weight row, as in the
    reference; then again with the non-finite codes zeroed, so that every finite code is checked in every row."""
    from synodic.quant import QTensor, dequantize
    e = 8 if fmt in ("mxfp4", "nvfp4") else 4
    blk = 16 if fmt == "nvfp4" else 32
    ar = torch.arange(256)
    data = ((ar[:, None] + 37 * torch.arange(4)[None, :]) % 256).to(torch.uint8).reshape(32, 32).to(device)
    K = 32 * (2 if e == 8 else 1)
    code = 0x38 if fmt == "nvfp4" else 127  # block scale 1.0
    p = torch.ones(1, device=device) if fmt == "nvfp4" else None
    eye = torch.eye(K, device=device)
    for d in (data, None):
        if d is None:
            if e == 8:
                break
            lut = QTensor(fmt, torch.arange(256, dtype=torch.uint8, device=device)[None],
                          torch.full((1, 8), code, dtype=torch.uint8, device=device), None, (1, 256))
            finite = torch.isfinite(dequantize(lut)[0])
            d = torch.where(finite[data.long()], data, torch.zeros_like(data))
            assert not (d == data).all()
        q = QTensor(fmt, d, torch.full((32, K // blk), code, dtype=torch.uint8, device=device), p, (32, K))
        y = quant_linear(eye, q, backend="triton", config=dict(KERNEL="gemvh", BLOCK_N=16, BLOCK_K=32, BLOCK_M=2))
        torch.testing.assert_close(y, quant_linear(eye, q, backend="ref"), rtol=0, atol=0, equal_nan=True)
        if e == 8 or d is not data:  # all codes finite: each y entry is one weight, no NaN * 0 from its row
            torch.testing.assert_close(y, dequantize(q).T, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: backend 'auto' takes the kernel on CUDA only")
def test_auto_rows_with_and_without_dense_copy():
    """'auto' sends up to KERNEL_MAX_ROWS[fmt] rows to the packed kernel with a dense copy kept, up to
    PACKED_ONLY_MAX_ROWS[fmt] without; above that the lean layer dequantizes per call and matches the dense layer
    bit for bit."""
    from synodic.quant.linear import KERNEL_MAX_ROWS, PACKED_ONLY_MAX_ROWS
    w, _, _, _ = make(64, 256, 1, torch.float32, "cuda", 3)
    ql = QuantLinear(w, None, mode="w4a16", fmt="nvfp4", method="rtn")
    lean = QuantLinear.from_packed(ql.qtensor(), None, None, mode="w4a16", dtype=torch.bfloat16, dense=False)
    k, p = KERNEL_MAX_ROWS["nvfp4"], PACKED_ONLY_MAX_ROWS["nvfp4"]
    assert k < p
    for rows, kept, packed in ((k, True, True), (k + 1, False, True), (p, False, True), (p + 1, False, False)):
        x = torch.randn(rows, 256, device="cuda").to(torch.bfloat16)
        assert ql.uses_kernel(x) is kept and lean.uses_kernel(x) is packed
        y, y_lean = ql(x), lean(x)
        if packed:
            assert rel_rmse(y_lean, y) < 1e-2
        else:
            assert torch.equal(y_lean, y)
    other = QuantLinear(w, None, mode="w4a16", fmt="int4_g64", method="rtn", dense=False)  # no packed kernel
    x = torch.randn(2, 256, device="cuda").to(torch.bfloat16)
    assert not other.uses_kernel(x) and other(x).shape == (2, 64)
