"""Launch configs and the launch of the "kgemm" kernel (kgemm.py) over a KMajorWeight (kmajor.py).

A config: BLOCK_M (rows per tile, >= 16), BLOCK_N (>= 16), SPLIT_K (K splits; each takes whole groups), SWAP
(0: x the MMA's A operand, 1: the weight), ASM (1: the inline-asm bf16x2 decode multiply on the GPU), SEM
(in-kernel split-K sum), num_warps, num_stages. The K tile is one layout group (256 codes MXFP4, 128 NVFP4 /
MXFP8). A call without a config takes the GPU's tuned table entry (tuned.py, section "kgemm") where there is one,
else `kgemm_default_config` (untimed, so decode steps stay capturable in CUDA graphs).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import tuned
from .codec import FMT_IDS
from .kgemm import _kgemm_kernel
from .kmajor import DSH, KMajorWeight

KGEMM_KEYS = {"KERNEL", "BLOCK_M", "BLOCK_N", "SPLIT_K", "SWAP", "ASM", "SEM", "num_warps", "num_stages"}


def kgemm_split(M: int, N: int, G: int, bm: int, bn: int, sms: int, per_sm: int = 2, min_groups: int = 4) -> int:
    """Largest power-of-two K split keeping <= per_sm programs per SM and >= min_groups K groups per split: split
    K only where the output tiles alone leave SMs idle (small M, small N)."""
    progs = triton.cdiv(N, bn) * triton.cdiv(M, bm)
    split = 1
    while split < 32 and progs * split * 2 <= per_sm * sms and G // (split * 2) >= min_groups:
        split *= 2
    return split


def kgemm_default_config(M: int, N: int, G: int, fmt: str, sms: int = 132) -> dict:
    """The untuned heuristic: the x tile grows with M (16 / 32 / 64 / 128 rows), [.. x 128] weight tiles, 8 warps
    from 128 rows; x the A operand; the asm decode; K split for small grids. G: the weight's K groups. (The x tile
    of a 256-code MXFP4 group is BLOCK_M x 512 bytes a stage: [128 x 256] tiles exceed the 227 KB of shared memory,
    4-warp BLOCK_N = 256 tiles spill: offline sm_90 compiles.)"""
    if M <= 16:
        bm, bn, nw, st = 16, 128, 4, 4
    elif M <= 32:
        bm, bn, nw, st = 32, 128, 4, 4
    elif M <= 64:
        bm, bn, nw, st = 64, 128, 4, 3
    else:
        bm, bn, nw, st = 128, 128, 8, 3
    return dict(KERNEL="kgemm", BLOCK_M=bm, BLOCK_N=bn, SWAP=0, ASM=1, SEM=True, num_warps=nw, num_stages=st,
                SPLIT_K=kgemm_split(M, N, G, bm, bn, sms))


def resolve_kgemm_config(M: int, N: int, G: int, fmt: str, config: dict | None, sms: int = 132) -> dict:
    """`config` over the heuristic; a config that changes the tile without SPLIT_K gets its split here."""
    from .launch import check_launch_keys, check_tile
    config = dict(config or {})
    check_launch_keys(config, KGEMM_KEYS, "kgemm", "a KMajorWeight")
    cfg = dict(kgemm_default_config(M, N, G, fmt, sms), **config)
    if "SPLIT_K" not in config and set(config) & {"BLOCK_M", "BLOCK_N"}:
        cfg["SPLIT_K"] = kgemm_split(M, N, G, cfg["BLOCK_M"], cfg["BLOCK_N"], sms)
    check_tile(cfg)
    for k in ("SWAP", "ASM"):
        if cfg[k] not in (0, 1, False, True):
            raise ValueError(f"config {k}={cfg[k]!r}: expected 0 or 1")
    if not isinstance(cfg["SPLIT_K"], int) or cfg["SPLIT_K"] < 1:
        raise ValueError(f"config SPLIT_K={cfg['SPLIT_K']!r}: expected an integer >= 1")
    return cfg


_CNT: dict = {}  # kgemm's own split-K counters (launch._counters grows them)
_F32: dict = {}


def _stand_in(device: torch.device) -> torch.Tensor:
    t = _F32.get(device)
    if t is None:
        t = _F32[device] = torch.zeros(4, dtype=torch.float32, device=device)
    return t


def quant_kgemm_triton(x2d: torch.Tensor, w: KMajorWeight, s: torch.Tensor | None, bias: torch.Tensor | None,
                       config: dict | None = None) -> torch.Tensor:
    """x2d [M, K] (contiguous rows) -> [M, N] in x2d.dtype; s fp32 [K] or None; bias [N] or None."""
    from .launch import _counters, _device_name, _sms
    M, K = x2d.shape
    N, dev = w.N, x2d.device
    E = 8 if FMT_IDS[w.fmt] <= 1 else 4
    G = w.KP // (E * w.block)
    if config is None and dev.type == "cuda":
        config = tuned.lookup_gemm(_device_name(dev), w.fmt, N, w.K, M, section="kgemm")
    cfg = resolve_kgemm_config(M, N, G, w.fmt, config, _sms(dev))
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    gps = triton.cdiv(G, cfg["SPLIT_K"])
    split = triton.cdiv(G, gps)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    low = x2d.dtype == torch.bfloat16 and not interp  # bf16 operands; else fp32 ones (see kgemm.py)
    grid = (triton.cdiv(M, bm), split, triton.cdiv(N, bn))
    cnt = _counters(dev, grid[0] * grid[2], _CNT) if split > 1 and cfg.get("SEM", True) else None
    y = torch.empty(M, N, dtype=x2d.dtype, device=dev)
    # fp32 partials, or an fp32 stand-in: the pointer's dtype is part of the compile key, one compile for any split
    part = torch.empty(split, M, N, dtype=torch.float32, device=dev) if split > 1 else _stand_in(dev)
    p = None if w.tensor_scale is None else w.tensor_scale.reshape(1).to(torch.float32)
    dummy = w.factors
    _kgemm_kernel[grid](
        x2d, w.words, w.factors, dummy if p is None else p, dummy if s is None else s, dummy if bias is None else bias,
        y, part, dummy if cnt is None else cnt, M, N, K, G, gps, split, int(cnt is not None), x2d.stride(0),
        FMT=FMT_IDS[w.fmt], B=w.block, HAS_S=s is not None, HAS_P=p is not None, HAS_BIAS=bias is not None,
        DT=tl.bfloat16 if low else tl.float32, DOT_PREC="tf32" if low else "ieee", BLOCK_M=bm,
        BLOCK_N=bn, SWAP=int(cfg["SWAP"]), ASM=int(bool(cfg["ASM"]) and low), EVEN_N=N % bn == 0, EVEN_K=K == w.KP,
        OMUL=float(2.0 ** DSH), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    if split > 1 and cnt is None:
        return part.sum(0).to(x2d.dtype)
    return y
