"""Triton kernels of `quant_linear`: GEMV (M = 1, 2) and skinny GEMM (M >= 3) straight from packed
block-quantized weights.

Weights stay in the layout `QTensor` stores (no conversion): codes [N, K/2] uint8 for 4-bit formats
(two per byte, even k in the low nibble), [N, K] for 8-bit; block scales [N, K/B] uint8 (E8M0 for MX,
E4M3 for NVFP4, whose FP32 per-tensor scale multiplies the accumulator once at the end). Activations:
x times s (fp32), optionally fake-quantized to MXFP4 in-kernel (blocks of 32, 'floor' E8M0 scale, E2M1
round-half-even — the same values as synodic.quant.fake_quant).

Five kernels, picked by config KERNEL:
  * "gemvh" (CUDA cores, one or two rows; the default for M <= 2 with bf16 / fp16 activations; gemvh.py): fp16x2
    FMAs on weights decoded into fp16 halves, activations scaled per block into fp16 range; 2.1-2.3x bf16 for
    MXFP4 at M = 1 on the H200, ~1.5x at M = 2;
  * "dotp" (any M; the default for M >= 3; `_qdotp_kernel`): codes decoded straight to bf16 in the MMA operand
    layout, K permuted inside a tile (see the note above the kernel); 0.63-0.94x bf16 at M = 32 on the H200;
  * "dot" (any M; `_qdot_kernel`; the M >= 2 default until dotp): the decoded weight tile is the left tl.dot
    operand, bf16 MMA (fp32 IEEE for fp32 activations), M = 1 padded to a 16-row tile;
  * "tc" (any M, by config only; tc.py): a plain tensor-core GEMM, the byte tile decoded into its even-k / odd-k
    planes against x split the same way in registers; ties dotp from 32 rows, not routed (BENCHMARKS.md Q7);
  * "gemv32" (CUDA cores, one row; the default for one row of fp32 activations; `_qgemv32_kernel`): the code
    bytes viewed as int32 words (8 nibbles / 4 bytes per word), two codes decoded per few integer ops, fp32 FMAs
    with x, block sums times the scale; see above it; 1.03-1.47x bf16.
Rows > 1 asked of gemv32 take the M >= 2 default. Decoding is exact bit manipulation (see `_bits_lo`); MXFP8
(E4M3 / E5M2) may instead use the hardware fp8 conversion in "dot" (config FP8_CVT=True).
SPLIT_K programs share one output tile's K range; the last one to finish sums the fp32 partials in split
order (`_store_out`: deterministic, no second launch). The launch config is a heuristic (no timing at
run time, so decode steps stay capturable in CUDA graphs); `python -m benchmarks.quant_linear` sweeps.

Why not Hopper's FP8 tensor cores (tl.dot on fp8 operands) for 8-bit weights: the GEMV (M = 1) is
bandwidth-bound — one multiply-add per weight byte read, a tensor core has nothing to do there; and an
fp8 dot would need (a) the activations quantized to fp8 too (W8A8, not this weight-only W8A16 path)
with their own scales, (b) the per-(row, 32-block) E8M0 weight scales applied outside the MMA: one
tl.dot per 32-wide K block, its fp32 partial times the [BLOCK_M, 1] x-scale and the [1, BLOCK_N]
w-scale before accumulating (or tl.dot_scaled, which Hopper runs only as a bf16 emulation), with
BLOCK_M >= 16 tiles padded for M < 16. Worth it only for the M >= 16 GEMM path; not built.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import tuned
from .codec import FMT_IDS
from .dot import _DSH, _qdot_kernel
from .dotp import _qdotp_kernel
from .gemv32 import _qgemv32_kernel
from .gemvh import _qgemvh_kernel, gemvh_omul
from .tc import _qtc_kernel

# --- launch ----------------------------------------------------------------------------------------------------

KERNELS = ("dot", "gemv32", "dotp", "gemvh", "tc")  # config KERNEL: tl.dot (any M) | CUDA-core GEMV from int32
# code words (M = 1) | tl.dot on bf16-decoded, K-permuted weight tiles (any M; see "dotp" above) | the fp16x2 GEMV
# (any M, 1 or 2 rows per program; gemvh.py) | the plain tensor-core GEMM (any M; tc.py)


CONFIG_KEYS = {"KERNEL", "BLOCK_N", "BLOCK_K", "BLOCK_M", "SPLIT_K", "SEM", "num_warps", "num_stages", "FP8_CVT",
               "TWO_MUL", "PREFETCH", "SWAP"}


def _auto_split(progs: int, K: int, bk: int, sms: int, per_sm: int, min_iters: int, ceil: bool = False,
                min_per_sm: int = 0) -> int:
    """Largest power-of-two K split keeping <= per_sm programs per SM and >= min_iters K tiles each (ceil: counting
    a split's last, partial tile, as the launch rounds a split up to whole tiles); while fewer than min_per_sm
    programs per SM run, splits may go down to one tile."""
    split = 1
    while split < 64 and progs * split * 2 <= per_sm * sms:
        tiles = triton.cdiv(triton.cdiv(K, split * 2), bk) if ceil else K // (split * 2) // bk
        if tiles < (1 if progs * split < min_per_sm * sms else min_iters):
            break
        split *= 2
    return split


def _split(kern: str, fmt: str, M: int, N: int, K: int, bn: int, bk: int, sms: int, rows: int | None = None,
           prefetch: bool = False) -> int:
    """The K split of a launch, one rule per kernel (the defaults' and any config without SPLIT_K; see
    default_config). rows: x rows per program (BLOCK_M; default gemvh min(2, M), dot / dotp _bm(M)); prefetch:
    gemvh's PREFETCH (fewer, longer programs)."""
    if kern in ("dot", "dotp"):
        progs = triton.cdiv(N, bn) * triton.cdiv(M, rows or _bm(M))
        return _auto_split(progs, K, bk, sms, 6 if kern == "dotp" and fmt == "nvfp4" else 4, 4)
    if kern == "tc":  # up to 2 programs per SM (its tiles hold one or two), >= 4 K steps each
        return _auto_split(triton.cdiv(N, bn) * triton.cdiv(M, rows or _bm(M)), K, bk, sms, 2, 4)
    if kern == "gemv32":
        return _auto_split(triton.cdiv(N, bn), K, bk, sms, 16, 1)
    if (rows or min(2, M)) == 1:
        per_sm = 4 if prefetch else _GEMVH_M1[fmt][3]
        return _auto_split(triton.cdiv(N, bn), K, bk, sms, per_sm, 2, ceil=True, min_per_sm=2)
    return _auto_split(triton.cdiv(N, bn), K, bk, sms, 4 if prefetch else 8 if FMT_IDS[fmt] <= 1 else 7, 1)


# gemvh at M = 1 per format (see default_config): (BLOCK_N, BLOCK_K, num_warps, programs per SM, PREFETCH)
_GEMVH_M1 = {"mxfp4": (64, 512, 4, 11, 0), "nvfp4": (32, 512, 4, 4, 1),
             "mxfp8_e4m3": (16, 512, 2, 8, 0), "mxfp8_e5m2": (16, 512, 2, 8, 0)}


# gemvh at M = 2 per format: (BLOCK_N, BLOCK_K, num_warps); one-warp programs for NVFP4 and MXFP8 (see default_config)
_GEMVH_M2 = {"mxfp4": (32, 512, 4), "nvfp4": (16, 512, 1), "mxfp8_e4m3": (32, 256, 1), "mxfp8_e5m2": (32, 256, 1)}


# dotp (M >= 3; M >= 2 for fp32 activations) per format: (up to M rows, (BLOCK_N, BLOCK_K, num_stages)[, from K])
# on 4 warps, the first entry whose bounds cover M (and K); see default_config
_ANY_M = 1 << 62
_DOTP = {"mxfp4": ((16, (64, 256, 3)), (32, (128, 256, 2), 8192), (32, (64, 256, 3)), (64, (128, 64, 4)),
                   (128, (128, 64, 3)), (_ANY_M, (64, 128, 4))),
         "nvfp4": ((32, (64, 128, 4)), (64, (64, 256, 2)), (128, (128, 128, 3)), (_ANY_M, (64, 128, 4))),
         "mxfp8_e4m3": ((32, (64, 128, 3)), (_ANY_M, (64, 64, 4))),
         "mxfp8_e5m2": ((32, (64, 128, 3)), (_ANY_M, (64, 64, 4)))}


def default_config(M: int, N: int, K: int, fmt: str, sms: int = 132, fp32_act: bool = False) -> dict:
    """The heuristic launch config (no timing at run time: decode steps stay capturable in CUDA graphs); a call
    without a config takes the GPU's tuned table entry first (`tuned.py`). Every choice below won a same-run H200
    comparison against its alternatives and the bf16 linear; the sweeps, commands and times are in
    docs/tuning/quant_linear.md.
      M = 1, bf16 / fp16 activations: "gemvh" (fp16x2 FMAs; gemv32 took ~1.5x its time). 4-bit [64 x 512] on 4
      warps; NVFP4 [32 x 512] with PREFETCH (its E4M3 scale per 16 codes is hidden by a longer K loop with the next
      tile in registers; MXFP4 gained nothing from it, MXFP8 lost); MXFP8 [16 x 512] on 2 warps. K split: each
      split >= 2 K tiles (counting a partial one; one-tile splits ran 12-15 % slower on 4096x8192 and 6144x4096)
      unless fewer than 2 programs per SM would run (4096x4096, where they won), up to ~11 programs per SM for
      MXFP4, 4 for NVFP4, 8 for MXFP8.
      M = 2: gemvh with both rows in one program (two 2-row programs would decode every tile twice; 4 rows per
      program needed 168-255 registers and lost to dotp); one-warp programs for NVFP4 and MXFP8.
      M = 1, fp32 activations: "gemv32" (fp32 arithmetic), ~16 programs per SM.
      M >= 3 (M >= 2 for fp32 activations): "dotp" (tensor cores on bf16-decoded tiles), tiles from `_DOTP`, 4 warps,
      up to 4 programs per SM (6 for NVFP4: its big-N model shapes ran 4-14 % faster with the second split). The
      tiles are each format's best over a grid at M = 4, 16, 32 (and 64 for 4-bit without a dense copy) on
      4096x14336 and 14336x4096, except NVFP4 to 32 rows: its grid winner, [128 x 256], lost 13 % end to end on
      `nemotron_h_8b`, so [64 x 128] stays; and MXFP4 at 17-32 rows below K = 8192, where [64 x 256] (3 stages)
      beat the grid's [128 x 256] on 11 of the two presets' 12 such shapes, by 7-35 %, and lost on the bench's
      14336x4096. 65-128 rows (layers without a dense copy): [128 x 64] MXFP4 / [128 x 128] NVFP4, 3 stages, the
      best minimum over four preset shapes of a 16-tile grid (x tiles of 128 / 256 rows lost: the time grows with
      M at every x tile, docs/tuning/quant_linear.md)."""
    packed = FMT_IDS[fmt] <= 1
    if M == 1 and not fp32_act:
        bn, bk, nw, _, prefetch = _GEMVH_M1[fmt]
        cfg = dict(KERNEL="gemvh", BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=1,
                   SPLIT_K=_split("gemvh", fmt, M, N, K, bn, bk, sms, 1, bool(prefetch)), SEM=True, num_warps=nw,
                   num_stages=2)
        return dict(cfg, PREFETCH=1) if prefetch else cfg
    if M == 2 and not fp32_act:
        bn, bk, nw = _GEMVH_M2[fmt]
        return dict(KERNEL="gemvh", BLOCK_N=bn, BLOCK_K=bk, BLOCK_M=2,
                    SPLIT_K=_split("gemvh", fmt, M, N, K, bn, bk, sms, 2), SEM=True, num_warps=nw, num_stages=2)
    if M == 1:
        bn, bk = (16, 512) if packed else (32, 128)
        return dict(KERNEL="gemv32", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("gemv32", fmt, M, N, K, bn, bk, sms),
                    SEM=True, num_warps=4, num_stages=2)
    bn, bk, st = next(e[1] for e in _DOTP[fmt] if M <= e[0] and K >= (e[2] if len(e) > 2 else 0))
    return dict(KERNEL="dotp", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("dotp", fmt, M, N, K, bn, bk, sms), SEM=True,
                num_warps=4, num_stages=st)


def tc_step(fmt: str) -> int:
    """The "tc" kernel's K step (its BLOCK_K): 64 code bytes a row."""
    return 128 if FMT_IDS[fmt] <= 1 else 64


def tc_config(M: int, fmt: str) -> dict:
    """The "tc" kernel's tile by rows (from the H100 sweep, BENCHMARKS.md Q7): to 32 rows the weight as the MMA's
    wide side ([128 weight rows x M padded to >= 16], register A, 4 warps); 33-128 rows x as the A operand, [64 rows
    x 128] on 4 warps; above, [128 x 128] on 8 warps."""
    if M <= 32:
        return dict(KERNEL="tc", SWAP=1, BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=128,
                    BLOCK_K=tc_step(fmt), SEM=True, num_warps=4, num_stages=3)
    bm, nw, st = (64, 4, 4) if M <= 128 else (128, 8, 3)
    return dict(KERNEL="tc", SWAP=0, BLOCK_M=bm, BLOCK_N=128, BLOCK_K=tc_step(fmt), SEM=True, num_warps=nw,
                num_stages=st)


def _dot_config(M: int, N: int, K: int, fmt: str, sms: int) -> dict:
    """Config of the "dot" kernel when a config asks for it (the best of its sweep, docs/tuning/quant_linear.md):
    4-bit [64 x 128] on 4 warps, 4 stages; MXFP8 [128 x 64] with the hardware fp8 conversion (FP8_CVT)."""
    packed = FMT_IDS[fmt] <= 1
    bn, bk = (64, 128) if packed else (128, 64)
    cfg = dict(KERNEL="dot", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=_split("dot", fmt, M, N, K, bn, bk, sms), SEM=True,
               num_warps=4, num_stages=4)
    if not packed:
        cfg["FP8_CVT"] = True
    return cfg


def _bm(M: int) -> int:
    """tl.dot: x rows per tile (the MMA's narrow side; M = 1 padded to 16)."""
    return min(64, max(16, triton.next_power_of_2(M)))


def resolve_config(M: int, N: int, K: int, fmt: str, config: dict | None, sms: int = 132,
                   fp32_act: bool = False) -> dict:
    """The full launch config: `config` over the heuristic of its KERNEL; a missing SPLIT_K is chosen for
    the config's tile (so one sweep entry fits every shape)."""
    config = dict(config or {})
    bad = sorted(set(config) - CONFIG_KEYS)
    if bad:
        raise ValueError(f"config {bad[0]}={config[bad[0]]!r}: not a launch key; expected one of "
                         f"{', '.join(sorted(CONFIG_KEYS))}")
    kern = config.get("KERNEL")
    if kern is not None and kern not in KERNELS:
        raise ValueError(f"config KERNEL={kern!r}: expected one of {', '.join(KERNELS)}")
    if kern is None:
        base = default_config(M, N, K, fmt, sms, fp32_act)
    elif kern in ("gemv32", "gemvh"):
        base = dict(KERNEL=kern, BLOCK_N=32, BLOCK_K=256 if FMT_IDS[fmt] <= 1 else 128, SEM=True, num_warps=4,
                    num_stages=2)
    elif kern == "dot":
        base = _dot_config(M, N, K, fmt, sms)
    elif kern == "tc":
        base = tc_config(M, fmt)
    else:  # dotp: the M >= 2 default's tile
        base = dict(KERNEL=kern, BLOCK_N=64, BLOCK_K=128 if FMT_IDS[fmt] <= 1 else 64, SEM=True, num_warps=4,
                    num_stages=4)
    cfg = dict(base, **config)
    # a config that changes the tile gets its split chosen here; otherwise the default's own split stands
    if "SPLIT_K" not in config and set(config) & {"KERNEL", "BLOCK_N", "BLOCK_K", "BLOCK_M", "PREFETCH"}:
        cfg["SPLIT_K"] = _split(cfg["KERNEL"], fmt, M, N, K, cfg["BLOCK_N"], cfg["BLOCK_K"], sms, cfg.get("BLOCK_M"),
                                bool(cfg.get("PREFETCH")))
    return cfg


def _code_shift(fmt: str, cvt: bool) -> int:
    """R: the kernels' raw decode gives value * 2^-R."""
    if FMT_IDS[fmt] <= 1:
        return 126
    if cvt:
        return 0
    return 120 if fmt == "mxfp8_e4m3" else 112


_CNT: dict = {}


def _counters(device: torch.device, n: int, store: dict | None = None) -> torch.Tensor | None:
    """Per-output-tile split-K counters (int32, zero between calls: the last program resets its own).
    Grown outside CUDA-graph capture only; None while capturing with too few (then the host sums).
    store: the per-device buffers (this module's by default; kgemm_launch keeps its own)."""
    store = _CNT if store is None else store
    t = store.get(device)
    if t is None or t.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        t = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        store[device] = t
    return t


def quant_linear_triton(x2d: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, p: torch.Tensor | None,
                        fmt: str, qblock: int, s: torch.Tensor | None, bias: torch.Tensor | None,
                        act_quant: str | None, config: dict | None = None) -> torch.Tensor:
    """x2d [M, K] -> [M, N] in x2d.dtype. act_quant='mxfp4' needs qblock 32 (the caller quantizes
    activations itself for NVFP4 weights)."""
    M, K = x2d.shape
    N = data.shape[0]
    f32 = x2d.dtype == torch.float32
    if config is None:
        config = tuned_config(M, N, K, fmt, x2d.device, f32)
    cfg = resolve_config(M, N, K, fmt, config, _sms(x2d.device), f32)
    kern = cfg["KERNEL"]
    if kern == "gemv32" and M != 1:  # the fp32 CUDA-core GEMV reads one row; more rows take the M >= 2 default
        cfg = resolve_config(M, N, K, fmt, {k: v for k, v in (config or {}).items() if k != "KERNEL"},
                             _sms(x2d.device), f32)
        kern = cfg["KERNEL"]
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    if bk % qblock or bk < 32 or bk & (bk - 1):
        raise ValueError(f"config BLOCK_K={bk}: expected a power of two >= 32, a multiple of the format block {qblock}")
    if act_quant is not None and qblock != 32:
        raise ValueError(f"act_quant={act_quant!r} in-kernel needs 32-blocks of weights, got {qblock}")
    k_per = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per)
    cvt = bool(cfg.get("FP8_CVT", False)) and fmt.startswith("mxfp8")
    if cvt and kern != "dot":
        raise ValueError(f"config FP8_CVT=True: only KERNEL='dot' takes it, got KERNEL={kern!r}")
    if cfg.get("PREFETCH", 0) and kern != "gemvh":
        raise ValueError(f"config PREFETCH={cfg['PREFETCH']!r}: only KERNEL='gemvh' takes it, got KERNEL={kern!r}")
    if kern == "gemvh" and cfg.get("BLOCK_M", 1) not in (1, 2):
        raise ValueError(f"config BLOCK_M={cfg['BLOCK_M']!r}: KERNEL='gemvh' takes 1 or 2 rows per program")
    if kern == "dotp" and ("TWO_MUL" in cfg or "BLOCK_M" in cfg and cfg["BLOCK_M"] < 16):
        raise ValueError("config KERNEL='dotp': no TWO_MUL, BLOCK_M >= 16")
    if "SWAP" in cfg and kern != "tc":
        raise ValueError(f"config SWAP={cfg['SWAP']!r}: only KERNEL='tc' takes it, got KERNEL={kern!r}")
    if kern == "tc":
        check_tile(cfg)
        if bk != tc_step(fmt) or cfg["SWAP"] not in (0, 1) or "TWO_MUL" in cfg:
            raise ValueError(f"config KERNEL='tc': BLOCK_K={tc_step(fmt)} for {fmt} (got {bk}), SWAP 0 or 1 (got "
                             f"{cfg['SWAP']!r}), no TWO_MUL")
    dummy = data
    common = dict(FMT=FMT_IDS[fmt], QBLOCK=qblock, HAS_S=s is not None, HAS_BIAS=bias is not None,
                  ACT_Q=1 if act_quant == "mxfp4" else 0, BLOCK_N=bn, BLOCK_K=bk, FP8_CVT=cvt,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    sem = split > 1 and bool(cfg.get("SEM", True))
    y = torch.empty(M, N, dtype=x2d.dtype, device=x2d.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x2d.device) if split > 1 else y
    r = _code_shift(fmt, cvt)
    if kern == "dotp":
        if act_quant is not None:  # the permuted x tile has no 32-blocks: quantize x (exactly) beforehand
            from synodic.quant.qtensor import fake_quant
            x2d = fake_quant(x2d.float() if s is None else x2d.float() * s, act_quant).to(x2d.dtype)
            s = None
            common.update(HAS_S=False)
        bm = int(cfg.get("BLOCK_M", _bm(M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        low = x2d.dtype == torch.bfloat16 and not interp  # bf16 operands; else fp32 ones (see "dotp" above)
        _qdotp_kernel[grid](
            x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, DOT_DT=tl.bfloat16 if low else tl.float32, DOT_PREC="tf32" if low else "ieee",
            BLOCK_M=bm, ASM=low, EVEN=N % bn == 0 and K % bk == 0, SH=r - _DSH, SHMUL=float(2.0 ** (r - _DSH)),
            OMUL=float(2.0 ** _DSH),
            **{k: v for k, v in common.items() if k not in ("FP8_CVT", "ACT_Q")})
    elif kern == "tc":
        if act_quant is not None:  # x is split into even / odd k in the kernel: quantize it (exactly) beforehand
            from synodic.quant.qtensor import fake_quant
            x2d = fake_quant(x2d.float() if s is None else x2d.float() * s, act_quant).to(x2d.dtype)
            s = None
        bm = int(cfg["BLOCK_M"])
        grid = (triton.cdiv(M, bm), split, triton.cdiv(N, bn))  # M tiles of an N tile side by side: L2 reuse
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        low = x2d.dtype == torch.bfloat16 and not interp
        _qtc_kernel[grid](
            x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0),
            FMT=FMT_IDS[fmt], QBLOCK=qblock, HAS_S=s is not None, HAS_BIAS=bias is not None, SPLIT=split, SEM=sem,
            DOT_DT=tl.bfloat16 if low else tl.float32, DOT_PREC="tf32" if low else "ieee", BLOCK_M=bm, BLOCK_N=bn,
            SWAP=int(cfg["SWAP"]), ASM=low, EVEN_K=K % bk == 0, SH=r - _DSH, SHMUL=float(2.0 ** (r - _DSH)),
            OMUL=float(2.0 ** _DSH), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    elif kern == "gemvh":
        bm = int(cfg.get("BLOCK_M", min(2, M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        words = code_words(data)
        # the split's K range in words too: its divisibility gives 16-byte loads
        _qgemvh_kernel[grid](
            x2d, words, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, k_per // (8 if FMT_IDS[fmt] <= 1 else 4),
            x2d.stride(0), words.stride(0), scale.stride(0), SPLIT=split, SEM=sem, BLOCK_M=bm, ASM=not interp,
            EVEN=N % bn == 0 and K % bk == 0 and M % bm == 0, OMUL=gemvh_omul(FMT_IDS[fmt]),
            PREFETCH=1 if cfg.get("PREFETCH", 0) else 0, **{k: v for k, v in common.items() if k != "FP8_CVT"})
    elif kern == "gemv32":
        cnt = _counters(x2d.device, triton.cdiv(N, bn)) if sem else None
        sem = cnt is not None
        words = code_words(data)
        _qgemv32_kernel[(triton.cdiv(N, bn), split)](
            x2d, words, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, N, K, k_per, words.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, XMUL=float(2.0 ** (r - _DSH)), OMUL=float(2.0 ** _DSH),
            **{k: v for k, v in common.items() if k != "FP8_CVT"})
    else:
        bm = int(cfg.get("BLOCK_M", _bm(M)))
        grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
        cnt = _counters(x2d.device, grid[0] * grid[2]) if sem else None
        sem = cnt is not None
        # operands: bf16 / fp16 activations -> that dtype (decoded codes times scales are exact in it), fp32 ->
        # IEEE fp32; the interpreter's bf16/fp16 tl.dot is wrong (Triton 3.9): fp32 there, exact for these
        low = x2d.dtype in (torch.bfloat16, torch.float16) and not interp
        dot_dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[x2d.dtype] if low else tl.float32
        # fp16 cannot hold value * 2^-64: exact two-multiply decode there (and when the config asks)
        two = bool(cfg.get("TWO_MUL", False)) or dot_dt == tl.float16
        dsh = 0 if (two or r == 0) else _DSH
        _qdot_kernel[grid](
            x2d, data, scale, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
            y, part, dummy if cnt is None else cnt, M, N, K, k_per, x2d.stride(0), data.stride(0), scale.stride(0),
            SPLIT=split, SEM=sem, DOT_DT=dot_dt, DOT_PREC="tf32" if low else "ieee", BLOCK_M=bm, TWO_MUL=two,
            RMUL=float(2.0 ** r), SH=r - dsh, SHMUL=float(2.0 ** (r - dsh)), OMUL=float(2.0 ** dsh), **common)
    if split > 1 and not sem:
        return part.sum(0).to(x2d.dtype)
    return y


def code_words(data: torch.Tensor) -> torch.Tensor:
    """Contiguous code bytes [N, B] (B % 4 == 0) as int32 words [N, B/4], little-endian (byte j of a word at
    bits 8j): a view, or a copy when the storage offset is not 4-byte aligned."""
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % 4 or not data.is_contiguous():
        raise ValueError(f"code words: expected contiguous uint8 [N, B] with B % 4 == 0, got {data.dtype} "
                         f"{tuple(data.shape)}")
    if data.storage_offset() % 4:
        data = data.clone()
    return data.view(torch.int32)


_SMS: dict = {}
_NAMES: dict = {}


def tuned_config(M: int, N: int, K: int, fmt: str, device: torch.device, fp32_act: bool = False) -> dict | None:
    """The device's tuned table entry for a call without a config (CUDA, bf16 / fp16 activations), or None: the
    heuristic (`default_config`) then decides."""
    if fp32_act or device.type != "cuda":
        return None
    return tuned.lookup(_device_name(device), fmt, N, K, M)


def _device_name(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NAMES:
        _NAMES[idx] = torch.cuda.get_device_name(idx)
    return _NAMES[idx]


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


# --- checks shared with kgemm_launch ---------------------------------------------------------------------------

def check_launch_keys(config: dict, keys: set, kernel: str, weight: str) -> None:
    """A config for a single-kernel weight (kgemm): only that kernel's launch keys, and KERNEL (if given)
    that kernel; one-line errors naming key and value."""
    bad = sorted(set(config) - keys)
    if bad:
        raise ValueError(f"config {bad[0]}={config[bad[0]]!r}: not a {kernel} launch key; expected one of "
                         f"{', '.join(sorted(keys))}")
    if config.get("KERNEL", kernel) != kernel:
        raise ValueError(f"config KERNEL={config['KERNEL']!r}: {weight} runs KERNEL='{kernel}'")


def check_tile(cfg: dict) -> None:
    """The MMA tile of tc / kgemm: BLOCK_M and BLOCK_N powers of two >= 16."""
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if bm < 16 or bm & (bm - 1) or bn < 16 or bn & (bn - 1):
        raise ValueError(f"config BLOCK_M={bm}, BLOCK_N={bn}: expected powers of two >= 16")
