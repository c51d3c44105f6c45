"""Benchmark of the learned indexer's decode scores on the GPU: the fused `index_scores` kernel vs the torch
path it replaced (page gather of the cached keys, fp8 → fp32, fp32 batched GEMM, ReLU, weighted head sum),
and the top-k selection over those scores: `topk_select`'s two Triton paths (one program per row, timed up to
32768 scores; the row split over many programs) vs the stable sort it replaced (top-k 2048; the ids must be equal).

    python -m benchmarks.index_scores --out index_scores.json [--rows 1,4,32] [--ctx 16384,16448,...]

Shape of dsa_mla_7b's indexer: H_I = 64 query heads of d_I = 128, keys fp8 e4m3 with one fp32 scale per token
(132 B per token), paged in 64-token pages scattered over a pool past the L2. One layer's scores per decode
step, CUDA-graph replays, both variants in the same process on the same inputs; reports µs, GB/s of key bytes
read (against the H200 copy rate, docs/measuring.md) and torch / kernel. Without a GPU: a tiny smoke under
TRITON_INTERPRET (plumbing only).
"""
from __future__ import annotations

import argparse
import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from synodic.kernels.index_scores import index_scores  # noqa: E402
from synodic.kernels.timing import COPY_GBPS_H200, graph_us  # noqa: E402
from synodic.kernels.topk_select import topk_select_ref  # noqa: E402
from synodic.kernels.topk_select.triton_impl import topk_select_triton  # noqa: E402

from benchmarks._cli import out_file, positive_ints
from synodic.kv.indexer import LearnedIndexer  # noqa: E402


def run_point(N, ctx, H, D, bs, device, gen, top_k=2048):
    view = -(-ctx // bs)
    P = max(4 * N * view, (256 << 20) // (bs * (D + 4)))  # pool past the L2 (>= 256 MB of keys)
    keys = (torch.randn(P, bs, D, generator=gen, device=device) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(P, bs, generator=gen, device=device) + 0.1
    pages = torch.randperm(P, generator=gen, device=device)[: N * view].view(N, view).to(torch.int32)
    q = torch.randn(N, H, D, generator=gen, device=device).to(torch.bfloat16)
    w = torch.randn(N, H, generator=gen, device=device).to(torch.bfloat16)

    def torch_path():
        k = keys[pages].flatten(1, 2)
        return LearnedIndexer.scores(q, w, k, scale[pages].flatten(1, 2), einsum=True)

    def kernel():
        return index_scores(q, w, keys, scale, pages, backend="triton")

    ref, got = torch_path(), kernel()
    err = float(((got - ref).norm() / ref.norm().clamp_min(1e-30)).item())
    res = {"N": N, "ctx": ctx, "rel_err": err, "torch_us": graph_us(torch_path),
           "kernel_us": graph_us(kernel)}
    nbytes = N * view * bs * (D + 4)
    res["kernel_GBps"] = nbytes / res["kernel_us"] / 1e3 if res["kernel_us"] == res["kernel_us"] else float("nan")
    res["speedup"] = res["torch_us"] / res["kernel_us"]
    # selection over these scores, the whole context visible
    T, k = got.shape[1], min(top_k, got.shape[1])
    pos = torch.full((N,), T - 1, dtype=torch.long, device=device)
    want = topk_select_ref(got, pos, k)
    res["sort_us"] = graph_us(lambda: topk_select_ref(got, pos, k))
    for name, split in [("single_us", False), ("split_us", True)]:
        if split or T <= 32768:  # the single program holds the row in registers (H200: 87 µs at 32768 already)
            assert torch.equal(topk_select_triton(got, pos, k, split=split), want), f"selection ({name})"
            res[name] = graph_us(lambda split=split: topk_select_triton(got, pos, k, split=split))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=None)
    ap.add_argument("--rows", type=positive_ints, default="1,4,32")
    ap.add_argument("--ctx", type=positive_ints, default="16384,16448,32768,65536")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    H, D, bs = 64, 128, 64
    rows, ctxs = a.rows, a.ctx
    if device == "cpu":
        H, D, bs, rows, ctxs = 3, 16, 4, [2], [10]
    gen = torch.Generator(device=device).manual_seed(0)
    res = [run_point(n, c, H, D, bs, device, gen) for c in ctxs for n in rows]
    print("| rows | context | torch µs | kernel µs | kernel GB/s of keys (% of copy rate) | torch / kernel | rel. err "
          "| stable sort µs | topk_select single-program µs | topk_select split µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res:
        sel = " | ".join(f"{r[c]:.1f}" if c in r else "—" for c in ("sort_us", "single_us", "split_us"))
        print(f"| {r['N']} | {r['ctx']} | {r['torch_us']:.1f} | {r['kernel_us']:.1f} | {r['kernel_GBps']:.0f} "
              f"({100 * r['kernel_GBps'] / COPY_GBPS_H200:.0f} %) | {r['speedup']:.2f}x | {r['rel_err']:.1e} | {sel} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": res}, f, indent=1)
    return res


if __name__ == "__main__":
    main()
