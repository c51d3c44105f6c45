"""Benchmark of top-k sparse attention (one decode step of one layer) on the GPU.

    python -m benchmarks.sparse_attention --out sparse_attention.json [--batches 1,3,6,32] [--k 256,2048]

Shape of the DSA-class preset dsa_mla_7b: 32 query heads over one KV head of head_dim 288 (576 bf16
values = 1152 B per selected row), ids drawn at random from a device pool of 2^18 rows (300 MB, past
the L2). Variants, timed in the same process on the same inputs (CUDA-graph replays):

- split:   the kernel's default split-K plan (id list cut into ~16 programs per row, then a combine);
- one:     the same kernel with one program per (row, KV head) — the launch shape before the split;
- torch:   the reference (gather rows, masked softmax, fp32 einsums).

Reports µs, GB/s of selected rows read (K and V) against the H200 copy rate (synodic.kernels.timing, docs/measuring.md),
and split / one. Without a GPU it runs a tiny smoke under TRITON_INTERPRET (correctness of the plumbing only).
"""
from __future__ import annotations

import argparse
import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from synodic.kernels.sparse_attention import sparse_attention, triton_impl  # noqa: E402
from synodic.kernels.timing import COPY_GBPS_H200, graph_us  # noqa: E402

from benchmarks._cli import out_file, positive_ints


def run_point(N, K, nq, nkv, hd, rows, device, gen):
    dt = torch.bfloat16
    q = torch.randn(N, nq, hd, generator=gen).to(dt).to(device)
    kv = torch.randn(rows, 2, nkv, hd, generator=gen).to(dt).to(device)
    ids = torch.randint(0, rows, (N, K), generator=gen, dtype=torch.int32).to(device)
    k, v = kv[:, 0], kv[:, 1]
    out = torch.empty_like(q)
    ref = sparse_attention(q, k, v, ids, backend="ref")
    res = {"N": N, "K": K, "splits": triton_impl.split_plan(K, hd)[2]}

    def split():
        sparse_attention(q, k, v, ids, out=out, backend="triton")

    def one():
        triton_impl.sparse_attention_triton(q, k, v, ids, hd ** -0.5, out=out, splits_per_row=1)

    def torch_ref():
        sparse_attention(q, k, v, ids, backend="ref")

    split()
    res["rel_err_vs_ref"] = float((out.float() - ref.float()).norm() / ref.float().norm())
    nbytes = N * K * 2 * nkv * hd * kv.element_size()
    for name, fn in (("split", split), ("one", one), ("torch", torch_ref)):
        us = graph_us(fn)
        res[f"{name}_us"] = us
        res[f"{name}_gbs"] = nbytes / us / 1e3 if us == us else float("nan")
    res["split_over_one"] = res["one_us"] / res["split_us"] if device == "cuda" else float("nan")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default="sparse_attention.json")
    ap.add_argument("--batches", type=positive_ints, default="1,3,6,32")
    ap.add_argument("--k", type=positive_ints, default="256,2048")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        nq, nkv, hd, rows, batches, ks = 32, 1, 288, 1 << 18, a.batches, a.k
    else:  # smoke
        nq, nkv, hd, rows, batches, ks = 4, 1, 24, 64, [2], [40]
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for K in ks:
        for N in batches:
            r = run_point(N, K, nq, nkv, hd, rows, device, gen)
            rows_out.append(r)
            print(f"N={N:3d} K={K:5d} splits={r['splits']:2d}: split {r['split_us']:8.1f} µs "
                  f"({r['split_gbs']:6.0f} GB/s, {100 * r['split_gbs'] / COPY_GBPS_H200:4.1f} % of copy) | one "
                  f"{r['one_us']:8.1f} µs | torch {r['torch_us']:8.1f} µs | split/one {r['split_over_one']:.1f}x "
                  f"| rel err {r['rel_err_vs_ref']:.1e}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "sparse_attention", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "shape": dict(nq=nq, nkv=nkv, hd=hd, rows=rows), "rows": rows_out}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
