"""Benchmark of the packed-weight decode linear (MXFP4 / NVFP4 / MXFP8 E4M3) against bf16 F.linear, and of
DualQuant's solve time for a whole 8B model, one process.

    python -m benchmarks.quant_linear --out quant.json [--budget 110] [--no-sweep] [--skip-dualquant]
        [--shapes 4096x14336,14336x4096] [--ms 1,32] [--formats mxfp4,nvfp4,mxfp8_e4m3]
        [--no-probe] [--kernels gemvh,dotp]
    TRITON_INTERPRET=1 python -m benchmarks.quant_linear --smoke     # CPU: every config vs the reference

1. GEMV / skinny GEMM, M in {1, 32}, weights (N, K) in {4096x4096, 4096x14336, 14336x4096}, bf16
   activations, the DualQuant deployment path (x * s fused in-kernel, weight-only: W4A16; W8A16 for
   mxfp8_e4m3, whose sweep also tries the hardware fp8 conversion, FP8_CVT=True). Each time is
   per call inside a CUDA graph of many calls that cycle over enough weight copies (> 4x L2) that every
   call reads its weight from HBM. Bytes = weight (codes + scales + s) + x + y. Per row: bf16, the run-time
   default (`us`; the GPU's tuned table entry for the shape if it has one, else the heuristic: the fp16x2 GEMV
   "gemvh" for M <= 2, tl.dot above); then, if the budget
   allows, the SWEEP candidates (`sweep`, `best_us` with its config). Every config is checked against the
   torch reference before it is timed (a config off by > 2e-2 rel. RMSE is not timed).
   Load probes (M = 1, unless --no-probe): kernels that read the code bytes and block scales in exactly a
   GEMV's tile pattern (grid, BLOCK_N, BLOCK_K, SPLIT_K, warps) and only XOR them into a per-row int32 (no x,
   no decode): "probe32" loads [BLOCK_N, BLOCK_K/E] int32 words (E codes per word) as "gemv32" / "gemvh" do. Timed
   beside the kernel on its tile, as GB/s of codes + scales (`*_load_GB_per_s`): probe near HBM speed and
   kernel far below -> decode arithmetic limits; probe slow -> the load pattern does.
2. DualQuant (MXFP4, 15 iterations) over every linear of the blocks of nemotron_h_8b, random bf16
   weights built on the GPU; wall time, per projection kind, mean relative weight MSE.
Prints markdown tables last and writes JSON (rewritten after each part, so a cut-short run keeps
what it measured).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import time

import torch
import triton
import triton.language as tl
from synodic.kernels.timing import graph_us

from benchmarks._cli import out_file

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]  # (N, K) = (out, in)
MS = [1, 32]
FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3"]
CHECK_TOL = 2e-2  # rel. RMSE vs the reference above which a config is reported broken and not timed
# Alternatives to the run-time heuristic (launch.default_config), most promising first (the sweep
# goes candidate by candidate over all rows, so a cut-short run has the first ones everywhere). BLOCK_K is
# given for 4-bit formats (BLOCK_K/2 code bytes per row); 8-bit formats use half (same bytes per row).
# No SPLIT_K: chosen per shape for the tile (launch.resolve_config).
# "dotp" (bf16-decoded, K-permuted tl.dot): the best tiles of a short H200 probe (4096x14336), per M
DOTP_M1 = [dict(KERNEL="dotp", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=2),
           dict(KERNEL="dotp", BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=3)]
DOTP_MN = [dict(KERNEL="dotp", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dotp", BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=6)]
# "gemvh" (fp16x2 GEMV): the best tiles and splits of the H200 sweeps (the default first: [64 x 512] on
# 4 warps), then the runners-up
GEMVH_M1 = [dict(KERNEL="gemvh", BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=2, **kw)
            for bn, bk, nw, kw in ((64, 512, 4, {}), (16, 1024, 2, {}), (64, 256, 4, {}), (16, 1024, 4, {}),
                                   (64, 512, 4, dict(SPLIT_K=4)), (64, 512, 4, dict(SPLIT_K=8)), (32, 512, 4, {}),
                                   (128, 256, 8, {}), (64, 1024, 8, {}), (32, 512, 4, dict(PREFETCH=1)))]
# gemvh for two rows (one weight decode for both; 4 rows per program, 168-255 registers, lost to dotp at M = 4 on
# the H200 and were removed)
GEMVH_MN = [dict(KERNEL="gemvh", BLOCK_N=32, BLOCK_K=512, BLOCK_M=2, num_warps=4, num_stages=2),
            dict(KERNEL="gemvh", BLOCK_N=64, BLOCK_K=512, BLOCK_M=2, num_warps=4, num_stages=2)]
# tc (the stored-layout tensor-core GEMM, tc.py): both orientations; BLOCK_M is clipped to the rows in candidates()
TC_MN = [dict(KERNEL="tc", SWAP=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_warps=nw, num_stages=3)
         for bm, bn, nw in ((64, 64, 4), (64, 128, 4), (128, 128, 8), (256, 128, 8))] + \
        [dict(KERNEL="tc", SWAP=0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_warps=nw, num_stages=st)
         for bm, bn, nw, st in ((64, 128, 4, 4), (128, 128, 8, 3), (128, 256, 8, 3))]
SWEEP = {
    "m1": GEMVH_M1 + DOTP_M1 + [
           dict(KERNEL="gemv32", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=64, BLOCK_K=256, num_warps=8, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=128, BLOCK_K=256, num_warps=8, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=64, BLOCK_K=512, num_warps=8, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=2),
           dict(KERNEL="gemv32", BLOCK_N=64, BLOCK_K=128, num_warps=2, num_stages=2),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=256, num_warps=8, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3, SEM=False),
           dict(KERNEL="dot", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=512, num_warps=4, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, TWO_MUL=True),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4)],
    "mN": GEMVH_MN + DOTP_MN + [
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=256, num_warps=8, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=3, SEM=False),
           dict(KERNEL="dot", BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=512, num_warps=4, num_stages=3),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, TWO_MUL=True),
           dict(KERNEL="dot", BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=4, BLOCK_M=16)] + TC_MN,
}


def candidates(M: int, fmt: str, kernels: tuple[str, ...] | None = None) -> list[dict]:
    """The sweep configs for a row (8-bit: half the BLOCK_K; MXFP8 also tries the hardware fp8 conversion),
    only those of `kernels` when given."""
    out = []
    if fmt.startswith("mxfp8") and (kernels is None or "dot" in kernels):
        out.append(dict(KERNEL="dot", FP8_CVT=True))
    for c in SWEEP["m1" if M == 1 else "mN"]:
        if kernels is not None and c["KERNEL"] not in kernels:
            continue
        c = dict(c)
        if not fmt.startswith(("mxfp4", "nvfp4")):
            c["BLOCK_K"] = max(32, c["BLOCK_K"] // 2)
        if c["KERNEL"] == "tc":  # x rows per tile: a power of two >= 16, no larger than the rows need
            c["BLOCK_M"] = min(c["BLOCK_M"], max(16, triton.next_power_of_2(M)))
            if c in out:
                continue
        out.append(c)
    return out


# --- load probes: a GEMV's weight reads without its arithmetic -------------------------------------------------

@triton.jit
def _probe32_kernel(w_ptr, sc_ptr, out_ptr, N, K, K_PER_SPLIT, stride_wn, stride_sn, QBLOCK: tl.constexpr,
                    E: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The loads of gemv32._qgemv32_kernel ("gemv32": [BLOCK_N, BLOCK_K / E] int32 code words, E codes per
    word; [BLOCK_N, G] scales), XORed: out[pid_k, n] = XOR of row n's code words and scale bytes in the split
    (w_ptr: int32, stride_wn in words)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    G: tl.constexpr = BLOCK_K // QBLOCK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    rows = offs_n.to(tl.int64)
    offs_g = tl.arange(0, G)
    offs_w = tl.arange(0, BLOCK_K // E)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    g_hi = k_hi // QBLOCK
    acc = tl.zeros((BLOCK_N, BLOCK_K // E), dtype=tl.int32)
    sacc = tl.zeros((BLOCK_N, G), dtype=tl.int32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        g = k0 // QBLOCK + offs_g
        mg = g < g_hi
        sc = tl.load(sc_ptr + rows[:, None] * stride_sn + g[None, :], mask=mn[:, None] & mg[None, :], other=0)
        cw = k0 // E + offs_w
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cw[None, :], mask=mn[:, None] & (cw < k_hi // E)[None, :],
                    other=0)
        sacc = sacc ^ sc.to(tl.int32)
        acc = acc ^ w
    out = tl.xor_sum(acc, axis=1) ^ tl.xor_sum(sacc, axis=1)
    tl.store(out_ptr + pid_k * N + offs_n, out, mask=mn)


def _split(K: int, cfg: dict) -> tuple[int, int]:
    """(programs along K, K per program) as quant_linear_triton derives them from the config."""
    bk = cfg["BLOCK_K"]
    k_per = triton.cdiv(triton.cdiv(K, cfg["SPLIT_K"]), bk) * bk
    return triton.cdiv(K, k_per), k_per


def probe(q, cfg: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the load probe on the tile of a resolved gemv32 config: int32 [split, N] of per-row XORs."""
    from synodic.kernels.quant_linear.launch import code_words
    N, K = q.shape
    qb = q.spec.block
    split, k_per = _split(K, cfg)
    if out is None:
        out = torch.empty(split, N, dtype=torch.int32, device=q.data.device)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), split)
    meta = dict(QBLOCK=qb, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"])
    packed = q.data.shape[1] * 2 == K
    w = code_words(q.data)
    _probe32_kernel[grid](w, q.scale, out, N, K, k_per, w.stride(0), q.scale.stride(0), E=8 if packed else 4, **meta)
    return out


def probe_ref(q, cfg: dict) -> torch.Tensor:
    """What `probe` computes, in numpy."""
    import numpy as np
    from synodic.kernels.quant_linear.launch import code_words
    N, K = q.shape
    qb = q.spec.block
    _, k_per = _split(K, cfg)
    codes = code_words(q.data).cpu().numpy().astype(np.int32)
    per_k = codes.shape[1] / K
    sc = q.scale.cpu().numpy().astype(np.int32)
    out = []
    for lo in range(0, K, k_per):
        hi = min(lo + k_per, K)
        out.append(np.bitwise_xor.reduce(codes[:, round(lo * per_k):round(hi * per_k)], axis=1)
                   ^ np.bitwise_xor.reduce(sc[:, lo // qb:hi // qb], axis=1))
    return torch.from_numpy(np.stack(out))




def _copies(nbytes: int) -> int:
    return max(2, math.ceil(ROTATE_BYTES / nbytes))


class Case:
    """One (N, K, M): bf16 weights, their quantized copies per format (cached), activations, s."""

    def __init__(self, N, K, M, gen, device="cuda"):
        self.N, self.K, self.M, self.device = N, K, M, device
        self.w = (torch.randn(N, K, device=device, generator=gen) * 0.02).to(torch.bfloat16)
        self.x = torch.randn(M, K, device=device, generator=gen).to(torch.bfloat16)
        self.s = torch.rand(K, device=device, generator=gen) + 0.5
        self.io_bytes = (M * K + M * N) * 2
        self._q: dict = {}

    def bf16(self) -> dict:
        import torch.nn.functional as F
        ws = [self.w.clone() for _ in range(_copies(self.w.numel() * 2))]
        fns = [lambda w=w: F.linear(self.x, w) for w in ws]
        us = graph_us(fns, calls=max(len(fns), 24))
        del ws
        b = self.N * self.K * 2 + self.io_bytes
        return {"us": us, "weight_bytes": self.N * self.K * 2, "GB_per_s": b / us / 1e3}

    def qs(self, fmt: str) -> list:
        """Enough copies of the quantized weight to rotate through > 4x L2 (the first is the checked one)."""
        if fmt not in self._q:
            from synodic.quant import quantize
            q = quantize(self.w.float() / self.s, fmt)
            n = _copies(self.wbytes(q)) if self.device == "cuda" else 1
            self._q[fmt] = [q] + [type(q)(q.fmt, q.data.clone(), q.scale.clone(),
                                          None if q.tensor_scale is None else q.tensor_scale.clone(), q.shape)
                                  for _ in range(n - 1)]
        return self._q[fmt]

    def wbytes(self, q) -> int:
        return q.nbytes() + self.K * 4

    def quant(self, fmt: str, config: dict | None) -> dict:
        from synodic.kernels.quant_linear import quant_linear
        qs = self.qs(fmt)
        fns = [lambda qc=qc: quant_linear(self.x, qc, self.s, backend="triton", config=config) for qc in qs]
        us = graph_us(fns, calls=max(len(fns), 24))
        wb = self.wbytes(qs[0])
        return {"us": us, "weight_bytes": wb, "GB_per_s": (wb + self.io_bytes) / us / 1e3}

    def dequant(self, fmt: str) -> dict:
        """The no-dense-copy path of a larger batch (QuantLinear dense=False): the weight dequantized to bf16 by
        the Triton dequant kernel, then the bf16 F.linear; and the dequant alone (GB/s of codes in + bf16 out)."""
        import torch.nn.functional as F
        from synodic.kernels.quant_dequant import dequant
        qs = self.qs(fmt)
        xs = (self.x.float() * self.s).to(torch.bfloat16)
        both = graph_us([lambda qc=qc: F.linear(xs, dequant(qc, torch.bfloat16)) for qc in qs],
                              calls=max(len(qs), 24))
        alone = graph_us([lambda qc=qc: dequant(qc, torch.bfloat16) for qc in qs], calls=max(len(qs), 24))
        moved = self.load_bytes(fmt) + self.N * self.K * 2
        return {"dequant_linear_us": both, "dequant_us": alone, "dequant_GB_per_s": moved / alone / 1e3}

    def load_bytes(self, fmt: str) -> int:
        """Code + scale bytes of the weight: what a load probe reads."""
        q = self.qs(fmt)[0]
        return q.data.numel() + q.scale.numel()

    def probe(self, fmt: str, cfg: dict) -> dict:
        """Time the load probe on the tile of the resolved gemv32 config `cfg`."""
        qs = self.qs(fmt)
        out = probe(qs[0], cfg)
        fns = [lambda qc=qc: probe(qc, cfg, out) for qc in qs]
        us = graph_us(fns, calls=max(len(fns), 24))
        return {"us": us, "load_GB_per_s": self.load_bytes(fmt) / us / 1e3}

    def check(self, fmt: str, config: dict | None = None) -> float:
        """Relative RMSE of the kernel under `config` vs the torch reference (NaN output -> inf)."""
        from synodic.kernels.quant_linear import quant_linear
        q = self.qs(fmt)[0]
        r = quant_linear(self.x, q, self.s, backend="ref").double()
        e = 0.0
        for _ in range(3):  # repeated: a split-K reduction race would show up as a varying error
            y = quant_linear(self.x, q, self.s, backend="triton", config=config).double()
            e = max(e, ((y - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item())
        return e if math.isfinite(e) else float("inf")


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


_TILE = ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages", "SEM")


def _diag(c: Case, fmt: str, kernel: str, full: dict, us: float, probes: bool, log) -> dict:
    """M = 1 load diagnostic of a timed GEMV config: its code + scale GB/s, and its tile's load probe."""
    d = {"kernel": kernel, "config": full, "us": us, "load_GB_per_s": c.load_bytes(fmt) / us / 1e3}
    if probes:
        try:
            r = c.probe(fmt, full)
            d.update(probe="probe32", probe_us=r["us"], probe_load_GB_per_s=r["load_GB_per_s"])
        except Exception as e:  # noqa: BLE001 - keep the kernel's time
            d["probe_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            log(f"probe on {full} failed: {d['probe_error']}")
    return d


def bench_gemv(log, shapes, ms, formats, cases: dict, probes: bool = True, dequant: bool = False) -> list[dict]:
    """bf16 vs the run-time default config, side by side per row; for M = 1 (gemv32) the load probe on its tile; with
    `dequant`, the dequant-then-bf16-linear path of QuantLinear(dense=False) too."""
    from synodic.kernels.quant_linear.launch import resolve_config, tuned_config
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, K in shapes:
        for M in ms:
            c = cases[(N, K, M)] = Case(N, K, M, gen)
            base = c.bf16()
            for fmt in formats:
                row = {"N": N, "K": K, "M": M, "format": fmt, "bf16_us": base["us"],
                       "bf16_GB_per_s": base["GB_per_s"], "bf16_weight_bytes": base["weight_bytes"], "sweep": [],
                       "load_diag": []}
                full = resolve_config(M, N, K, fmt, tuned_config(M, N, K, fmt, torch.device("cuda")), _sms())
                err = c.check(fmt, None)
                r = c.quant(fmt, None)
                row.update({"rel_rmse_vs_ref": err, "config": full, "us": r["us"], "GB_per_s": r["GB_per_s"],
                            "speedup": base["us"] / r["us"], "weight_bytes": r["weight_bytes"]})
                log(f"{N}x{K} M={M} {fmt} default {_short(full)}: {r['us']:.1f} us ({r['GB_per_s']:.0f} GB/s) vs "
                    f"bf16 {base['us']:.1f} us ({base['GB_per_s']:.0f} GB/s) -> {row['speedup']:.2f}x  err {err:.1e}"
                    f"{'  BROKEN' if err > CHECK_TOL else ''}")
                if dequant:
                    row.update(c.dequant(fmt))
                    log(f"    dequant + bf16 linear {row['dequant_linear_us']:.1f} us (dequant alone "
                        f"{row['dequant_us']:.1f} us, {row['dequant_GB_per_s']:.0f} GB/s)")
                ok = err <= CHECK_TOL
                row["best_us"] = r["us"] if ok else float("inf")
                row["best_config"] = full if ok else None
                if M == 1 and full["KERNEL"] in ("gemv32", "gemvh"):
                    row["load_diag"].append(_diag(c, fmt, full["KERNEL"], full, r["us"], probes, log))
                    for d in row["load_diag"]:
                        if "probe_load_GB_per_s" in d:
                            log(f"    {d['kernel']}: codes+scales {d['load_GB_per_s']:.0f} GB/s; {d['probe']} on its "
                                f"tile {d['probe_load_GB_per_s']:.0f} GB/s ({d['probe_us']:.1f} us)")
                row["best_speedup"] = base["us"] / row["best_us"]
                rows.append(row)
            torch.cuda.empty_cache()
    return rows


def sweep(rows: list[dict], cases: dict, deadline: float, log, probes: bool = True,
          kernels: tuple[str, ...] | None = None) -> None:
    """Time the candidates (checked first) until the deadline, candidate by candidate over all rows; keep
    each row's fastest correct config (the heuristic included). M = 1 GEMV entries get a load diagnostic."""
    from synodic.kernels.quant_linear.launch import resolve_config
    n = max(len(candidates(r["M"], r["format"], kernels)) for r in rows)
    for i in range(n):
        for row in rows:
            cands = candidates(row["M"], row["format"], kernels)
            if i >= len(cands):
                continue
            if time.monotonic() > deadline:
                log(f"sweep stopped: time budget (at candidate {i})")
                return
            c = cases[(row["N"], row["K"], row["M"])]
            cfg = cands[i]
            full = resolve_config(row["M"], row["N"], row["K"], row["format"], cfg, _sms())
            ent = {"config": full}
            try:
                ent["err"] = c.check(row["format"], cfg)
                if ent["err"] <= CHECK_TOL:
                    ent["us"] = c.quant(row["format"], cfg)["us"]
            except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                ent["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                log(f"config {full} failed: {ent['error']}")
            row["sweep"].append(ent)
            if "us" in ent and row["M"] == 1 and full["KERNEL"] in ("gemv32", "gemvh"):
                d = _diag(c, row["format"], full["KERNEL"], full, ent["us"], probes, log)
                row["load_diag"].append(d)
                ent["load_GB_per_s"] = d["load_GB_per_s"]
                if "probe_load_GB_per_s" in d:
                    ent["probe_load_GB_per_s"] = d["probe_load_GB_per_s"]
            if "us" in ent and ent["us"] < row["best_us"]:
                row["best_us"], row["best_config"] = ent["us"], full
            elif "err" in ent and ent["err"] > CHECK_TOL:
                log(f"{row['N']}x{row['K']} M={row['M']} {row['format']} config {full}: BROKEN err {ent['err']:.1e}")
            row["best_speedup"] = row["bf16_us"] / row["best_us"]
            row["best_GB_per_s"] = (row["weight_bytes"] + c.io_bytes) / row["best_us"] / 1e3


def smoke(log) -> None:
    """CPU (TRITON_INTERPRET=1): the heuristic and every sweep candidate vs the reference on tiny shapes, and the
    load probes of every M = 1 GEMV tile vs their numpy XOR."""
    import os

    from synodic.kernels.quant_linear.launch import resolve_config
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the Triton interpreter: set TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(0)
    bad = 0
    for N, K, M in [(72, 256, 1), (72, 256, 3), (72, 1024, 1), (200, 1024, 20)]:
        c = Case(N, K, M, gen, device="cpu")
        c.x = c.x.float()  # the interpreter runs fp32 dots; fp32 activations make the check tight
        for fmt in FORMATS:
            for cfg in [None] + candidates(M, fmt):
                full = resolve_config(M, N, K, fmt, cfg)
                tol = 3e-3 if full["KERNEL"] == "gemvh" else 1e-4  # gemvh: fp16 operands
                err = c.check(fmt, cfg)
                bad += err > tol
                log(f"smoke {N}x{K} M={M} {fmt} {cfg}: err {err:.1e}{'  BROKEN' if err > tol else ''}")
                if M == 1 and full["KERNEL"] == "gemv32":
                    q = c.qs(fmt)[0]
                    same = torch.equal(probe(q, full), probe_ref(q, full))
                    bad += not same
                    log(f"smoke {N}x{K} {fmt} probe32 {_short(full)}: {'ok' if same else 'WRONG'}")
    if bad:
        raise SystemExit(f"smoke: {bad} broken configs / probes")
    log("smoke: all configs match the reference, all probes their XOR")


def bench_dualquant(log, iters: int = 15, fmt: str = "mxfp4") -> dict:
    from synodic.models.presets import PRESETS
    from synodic.models.weights import random_model
    from synodic.quant.apply import select_linears
    from synodic.quant.methods import solve_full
    t0 = time.perf_counter()
    model = random_model(PRESETS["nemotron_h_8b"], 0, "cuda", torch.bfloat16)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    names, _ = select_linears(model, ["blocks.*"], fmt)
    mods = dict(model.named_modules())
    kinds: dict[str, dict] = {}
    errs, params = [], 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    solve_s = 0.0
    for n in names:
        w = mods[n].weight
        t1 = time.perf_counter()
        sol = solve_full(w, fmt, "dualquant", iters=iters)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t1
        solve_s += dt
        wf = w.float()
        errs.append(((wf - sol.effective_weight()).pow(2).sum() / wf.pow(2).sum()).item())  # syncs
        k = n.rsplit(".", 1)[-1]
        d = kinds.setdefault(k, {"layers": 0, "params": 0, "s": 0.0, "shape": list(w.shape)})
        d["layers"] += 1
        d["params"] += w.numel()
        d["s"] += dt
        params += w.numel()
        del sol, wf
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out = {"model": "nemotron_h_8b", "format": fmt, "iters": iters, "linears": len(names), "params": params,
           "wall_s": wall, "solve_s": solve_s, "model_build_s": build_s, "target_s": 30.0,
           "rel_mse_mean": sum(errs) / len(errs),
           "per_kind": kinds, "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30}
    log(f"DualQuant {fmt} x{iters}: {len(names)} linears, {params / 1e9:.2f}B params in {wall:.1f}s "
        f"(solves {solve_s:.1f}s) "
        f"(mean rel MSE {out['rel_mse_mean']:.3e})")
    del model
    torch.cuda.empty_cache()
    return out


def _short(cfg) -> str:
    if not cfg:
        return "-"
    keys = [("KERNEL", ""), ("BLOCK_M", "m"), ("BLOCK_N", "n"), ("BLOCK_K", "k"), ("SPLIT_K", "s"), ("num_warps", "w"),
            ("num_stages", "st")]
    out = "/".join(f"{t}{cfg[k]}" for k, t in keys if k in cfg)
    for flag in ("SEM", "TWO_MUL", "FP8_CVT", "PREFETCH"):
        if flag in cfg:
            out += f" {flag}={int(bool(cfg[flag]))}"
    return out


def _table(rows) -> str:
    cols = ["N x K", "M", "format", "bf16 us", "bf16 GB/s", "q MB", "heur us", "heur GB/s", "heur x", "best us",
            "best GB/s", "best x", "best config", "err"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        best_gbs = (r["weight_bytes"] + (r["M"] * r["K"] + r["M"] * r["N"]) * 2) / r["best_us"] / 1e3
        lines.append("| " + " | ".join([
            f"{r['N']}x{r['K']}", str(r["M"]), r["format"], f"{r['bf16_us']:.1f}", f"{r['bf16_GB_per_s']:.0f}",
            f"{r['weight_bytes'] / 1e6:.2f}", f"{r['us']:.1f}", f"{r['GB_per_s']:.0f}", f"{r['speedup']:.2f}x",
            f"{r['best_us']:.1f}", f"{best_gbs:.0f}", f"{r['best_speedup']:.2f}x", _short(r["best_config"]),
            f"{r['rel_rmse_vs_ref']:.1e}"]) + " |")
    return "\n".join(lines)


def _dequant_table(rows) -> str:
    cols = ["N x K", "M", "format", "bf16 us", "packed kernel us", "dequant + bf16 linear us", "dequant us",
            "dequant GB/s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if "dequant_us" in r:
            lines.append("| " + " | ".join([
                f"{r['N']}x{r['K']}", str(r["M"]), r["format"], f"{r['bf16_us']:.1f}", f"{r['us']:.1f}",
                f"{r['dequant_linear_us']:.1f}", f"{r['dequant_us']:.1f}", f"{r['dequant_GB_per_s']:.0f}"]) + " |")
    return "\n".join(lines)


def _diag_table(rows) -> str:
    """M = 1: each timed GEMV tile's code + scale GB/s beside its load probe's (no decode, no x)."""
    cols = ["N x K", "format", "kernel config", "us", "load GB/s", "probe", "probe us", "probe GB/s", "kernel/probe"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        for d in r.get("load_diag", []):
            p = "probe_load_GB_per_s" in d
            lines.append("| " + " | ".join([
                f"{r['N']}x{r['K']}", r["format"], _short(d["config"]), f"{d['us']:.1f}", f"{d['load_GB_per_s']:.0f}",
                d.get("probe", "-"), f"{d['probe_us']:.1f}" if p else "-",
                f"{d['probe_load_GB_per_s']:.0f}" if p else "-",
                f"{d['probe_us'] / d['us']:.2f}" if p else "-"]) + " |")
    return "\n".join(lines)


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in p.lower().split("x")) for p in text.split(",") if p]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=out_file, default="quant.json")
    ap.add_argument("--budget", type=float, default=110.0,
                    help="seconds from the start; the launch-config sweep stops after")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--skip-dualquant", action="store_true")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK list, e.g. 4096x14336")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="activation row counts, e.g. 1,32")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-probe", action="store_true", help="skip the M = 1 load probes")
    ap.add_argument("--smoke", action="store_true", help="CPU check of every config (needs TRITON_INTERPRET=1)")
    ap.add_argument("--kernels", default=None, help="sweep only these KERNELs, e.g. gemvh,gemv32")
    ap.add_argument("--dequant", action="store_true", help="also time dequant (Triton) + bf16 F.linear per row: "
                    "the larger-batch path of QuantLinear without a dense copy")
    a = ap.parse_args(argv)
    start = time.monotonic()
    log = lambda m: print(m, flush=True)  # noqa: E731
    if a.smoke:
        smoke(log)
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_quant needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    shapes, ms, formats = _pairs(a.shapes), [int(m) for m in a.ms.split(",")], a.formats.split(",")
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "argv": list(argv) if argv is not None else __import__("sys").argv[1:],
           "mode": "W4A16 (mxfp4, nvfp4) / W8A16 (mxfp8_e4m3) weight-only, DualQuant layout (x * s fused), "
                   "bf16 activations",
           "notes": ["times per call inside a CUDA graph; weights rotated over > 4x L2 so each call reads HBM",
                     "us/speedup: the run-time default (tuned table, else heuristic); best_*: the fastest correct "
                     "config of the sweep (the heuristic included)",
                     "load_diag (M = 1): per timed GEMV tile, code + scale bytes / kernel time, and the load probe "
                     "on that tile (probe32: gemv32's int32-word loads, XOR only)",
                     "Hopper has no FP4 tensor cores: W4A4 would be emulated (fake-quantized activations), "
                     "so only weight-only decode speed is measured"]}

    def save():
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)

    cases: dict = {}
    doc["gemv"] = bench_gemv(log, shapes, ms, formats, cases, probes=not a.no_probe, dequant=a.dequant)
    save()
    if not a.skip_dualquant:
        try:
            doc["dualquant"] = bench_dualquant(log)
        except Exception as e:  # noqa: BLE001 - keep the GEMV table
            doc["dualquant"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"DualQuant failed: {doc['dualquant']['error']}")
        save()
    if not a.no_sweep and time.monotonic() < start + a.budget:
        sweep(doc["gemv"], cases, start + a.budget, log, probes=not a.no_probe,
              kernels=tuple(a.kernels.split(",")) if a.kernels else None)
        save()
    doc["elapsed_s"] = time.monotonic() - start
    save()
    print()
    print(_table(doc["gemv"]))
    if any("dequant_us" in r for r in doc["gemv"]):
        print("\nWithout a dense copy (QuantLinear dense=False): packed kernel vs dequant + bf16 linear:\n")
        print(_dequant_table(doc["gemv"]))
    if any(r.get("load_diag") for r in doc["gemv"]):
        print("\nM = 1 load diagnostics (GB/s of code + scale bytes; kernel/probe = probe us / kernel us):\n")
        print(_diag_table(doc["gemv"]))
    dq = doc.get("dualquant", {})
    if "wall_s" in dq:
        print(f"\nDualQuant MXFP4 x{dq['iters']} over {dq['linears']} linears of nemotron_h_8b "
              f"({dq['params'] / 1e9:.2f}B params): {dq['wall_s']:.1f} s (target < 30 s), "
              f"mean rel. MSE {dq['rel_mse_mean']:.3e}, peak {dq['peak_mem_GiB']:.1f} GiB")
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
