"""Benchmark of the HiSparse miss path on the GPU: fused `kv_resolve` vs a plain gather of the same rows.

    python -m benchmarks.kv_resolve --out kv_resolve.json [--row-bytes 656] [--k 2048]

Rows are raw bytes (uint8 [pages, bs, row_bytes]; 656 B = DSA fp8 "ds_mla", 1152 B = MLA bf16) in a
pinned host pool much larger than the L2. For batch 1, 8, 32, 128 requests (one layer) it times:

- gather: `copy_rows` host → device of the same number of rows (scattered, and in 8-row runs);
- miss:   `kv_resolve` where every selected row misses (selections rotate over disjoint position
          sets, hot buffer B = 2k, so each call evicts k LRU slots and copies k rows per request);
- hit:    `kv_resolve` re-selecting the resident set (lookups + LRU rewrite, no copies).

Reports GB/s of host rows moved and miss/gather (target >= 0.90), each timed two ways: CUDA-graph replays
(the way the engine runs a decode step: a graph of the three rotating all-miss resolves, repeated; buffers
and scratch at fixed addresses) and eager `triton.testing.do_bench` medians (launch overhead included: at
batch 1 the resolve's two launches and its Python checks weigh against the gather's one launch).
Without a GPU it runs a tiny smoke under TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from synodic.kernels.kv_resolve import kv_resolve  # noqa: E402
from synodic.kernels.kv_resolve.triton_impl import ResolveScratch  # noqa: E402
from synodic.kernels.row_copy import copy_rows  # noqa: E402
from synodic.kernels.timing import graph_us  # noqa: E402

from benchmarks._cli import out_file, positive_int, positive_ints

_POOL: dict = {}


def host_pool(pages, bs, row_bytes, device):
    """One host pool per (bs, row size), allocated once at the largest batch and reused: pinning and
    filling ~10 GB takes longer than the timings. Contents are arbitrary bytes (only movement is timed)."""
    key = (bs, row_bytes)
    if key not in _POOL or _POOL[key].shape[0] < pages:
        _POOL.pop(key, None)
        pool = torch.empty(pages, bs, row_bytes, dtype=torch.uint8, pin_memory=device == "cuda")
        pool.view(-1)[:: 4093].fill_(7)  # touch every page so the first timed call pays no faults
        _POOL[key] = pool
    return _POOL[key][:pages]


def problem(batch, k, row_bytes, ctx_len, bs, device, clustered, gen, max_batch):
    B = 2 * k
    pages_per_req = -(-ctx_len // bs)
    S = batch + 1
    host = host_pool((max_batch + 1) * pages_per_req + 1, bs, row_bytes, device)
    hp = -(-(B + 1) // bs)
    dev = torch.zeros(S * hp + 1, bs, row_bytes, dtype=torch.uint8, device=device)
    t = dict(
        host_table=torch.arange(S * pages_per_req, dtype=torch.int32, device=device).view(S, pages_per_req),
        idx_table=torch.arange(S * pages_per_req, dtype=torch.int32, device=device).view(S, pages_per_req),
        slot_of=torch.full((S * pages_per_req, bs), -1, dtype=torch.int32, device=device),
        hot_table=torch.arange(S * hp, dtype=torch.int32, device=device).view(S, hp),
        hot_pos=torch.full((S, B + 1), -1, dtype=torch.int32, device=device),
        lru=torch.arange(B, dtype=torch.int32, device=device).repeat(S, 1),
    )
    # 3 disjoint selections per request (k positions each); clustered: runs of 8 consecutive positions
    sels = []
    for r in range(3):
        rows = []
        for _ in range(batch):
            if clustered:
                starts = torch.randperm(ctx_len // 8 // 3, generator=gen)[: k // 8] * 3 + r
                p = (starts[:, None] * 8 + torch.arange(8)).flatten()
            else:
                p = torch.randperm(ctx_len // 3, generator=gen)[:k] * 3 + r
            rows.append(p)
        sels.append(torch.stack(rows).to(torch.int32).to(device))
    return host, dev, t, sels, B


def bench(fn, device):
    if device == "cuda":
        import triton.testing
        return triton.testing.do_bench(fn, warmup=5, rep=50) * 1e-3
    import time
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sweep_configs(k, batch):
    """Miss-copy launch variants beside the default (one 8-row chunk per program, whole rows): the previous
    default (~2 programs per SM, 16-row chunks, 256-column steps), other chunk sizes, the fused copy, and the
    resolve program on 8 / 32 warps (default 16 at B = 4096), and the host copy staged beside the resolve on or
    off (default on at batch 1) with 4- / 8- / 16- / 32-row staging programs."""
    return {"stage": dict(stage=True), "no_stage": dict(stage=False), "stage_j32": dict(stage=True, stage_j=32),
            "stage_j8": dict(stage=True, stage_j=8), "stage_j4": dict(stage=True, stage_j=4),
            "stage_j8_w4": dict(stage=True, stage_j=8, num_warps=4),
            "prev_default": dict(copy_j=16, split=max(1, min(-(-k // 16), 264 // batch)), block_w=256),
            "chunk16": dict(copy_j=16, split=-(-k // 16)),
            "chunk4": dict(copy_j=4, split=-(-k // 4)),
            "fused": dict(split=0),
            "resolve_warps8": dict(num_warps=8), "resolve_warps32": dict(num_warps=32)}


def run_point(batch, k, row_bytes, ctx_len, bs, device, clustered, max_batch, sweep=False):
    gen = torch.Generator().manual_seed(batch)
    host, dev, t, sels, B = problem(batch, k, row_bytes, ctx_len, bs, device, clustered, gen, max_batch)
    rows = torch.arange(batch, device=device)
    pos = torch.full((batch,), ctx_len - 1, device=device)
    it = [-1]  # index of the selection resolved last (-1: none yet)
    ids = torch.empty(batch, k, dtype=torch.int32, device=device)
    n_miss = torch.empty(batch, dtype=torch.int32, device=device)
    scratch = ResolveScratch(batch, k, batch + 1, B, device)

    def resolve(sel, config=None):
        return kv_resolve(sel, rows, pos, res_table=None, hot_table=t["hot_table"], hot_pos=t["hot_pos"],
                          lru=t["lru"], idx_table=t["idx_table"], slot_of=t["slot_of"], src_table=t["host_table"],
                          src=host, dev=dev, block_size=bs, fast_path=False, ids=ids, n_miss=n_miss,
                          scratch=scratch, backend="triton", config=config)

    def rotation(config=None):  # three all-miss resolves (the selections rotate; B = 2k keeps two of them)
        for sel in sels:
            resolve(sel, config)
        it[0] = 2  # a graph replays the same three, so every replay ends on the third as well

    def miss(config=None):
        it[0] = (it[0] + 1) % 3
        return resolve(sels[it[0]], config)

    def all_miss(config=None):
        for _ in range(3):
            _, n = miss(config)
            assert int(n.sum()) == batch * k, "every row should miss"

    all_miss()
    t_miss = bench(miss, device)
    g_miss = graph_us(rotation, calls=6) / 3 if device == "cuda" else float("nan")
    all_miss()  # the graph's warm-up and replays ended on the third selection: the next three still all miss
    swept = {}
    if sweep:
        for name, cfg in sweep_configs(k, batch).items():
            all_miss(cfg)
            swept[name] = graph_us(lambda cfg=cfg: rotation(cfg), calls=6) / 3 if device == "cuda" else \
                bench(lambda cfg=cfg: miss(cfg), device) * 1e6
    resolve(sels[0])
    t_hit = bench(lambda: resolve(sels[0]), device)
    g_hit = graph_us(lambda: resolve(sels[0]))
    # the same rows as a plain gather: host rows of one selection → device rows
    src_rows = (t["host_table"][rows[:, None], sels[1].long() // bs].long() * bs + sels[1].long() % bs).flatten()
    dst_rows = torch.arange(src_rows.numel(), device=device) % (dev.shape[0] * bs)

    def gather():
        copy_rows(dev.view(-1, row_bytes), dst_rows, host.view(-1, row_bytes), src_rows)

    t_gather = bench(gather, device)
    g_gather = graph_us(gather)
    moved = batch * k * row_bytes
    out = {"batch": batch, "k": k, "row_bytes": row_bytes, "clustered": clustered,
           "miss_us": g_miss, "hit_us": g_hit, "gather_us": g_gather,
           "miss_GBps": moved / g_miss / 1e3, "gather_GBps": moved / g_gather / 1e3,
           "miss_over_gather": g_gather / g_miss,
           "eager": {"miss_us": t_miss * 1e6, "hit_us": t_hit * 1e6, "gather_us": t_gather * 1e6,
                     "miss_over_gather": t_gather / t_miss},
           "sweep_miss_us": swept}
    if device != "cuda":  # no graphs on the CPU smoke: the eager times stand in
        out.update({key: out["eager"][key] for key in ("miss_us", "hit_us", "gather_us", "miss_over_gather")})
        out["miss_GBps"], out["gather_GBps"] = moved / out["miss_us"] / 1e3, moved / out["gather_us"] / 1e3
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default=None)
    ap.add_argument("--row-bytes", type=positive_int, default=656)
    ap.add_argument("--k", type=positive_int, default=2048)
    ap.add_argument("--ctx", type=positive_int, default=65536)
    ap.add_argument("--bs", type=positive_int, default=64)
    ap.add_argument("--sweep", action="store_true", help="also time the miss-copy launch variants")
    ap.add_argument("--batches", type=positive_ints, default="1,8,32,128", help="requests per call, comma-separated")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = a.batches
    if device == "cpu":  # interpreter smoke: tiny shapes, timings meaningless
        a.k, a.ctx, a.bs, a.row_bytes, batches = 8, 97, 4, 40, [2]  # newest (96) never selected
    rows = [run_point(b, a.k, a.row_bytes, a.ctx, a.bs, device, c, max(batches), a.sweep)
            for c in (False, True) for b in batches]
    print("CUDA-graph replays (eager do_bench in brackets)")
    print("| batch | k | row B | clustered | miss µs | hit µs | gather µs | miss GB/s | gather GB/s | miss/gather |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e = r["eager"]
        print(f"| {r['batch']} | {r['k']} | {r['row_bytes']} | {r['clustered']} "
              f"| {r['miss_us']:.1f} ({e['miss_us']:.1f}) "
              f"| {r['hit_us']:.1f} ({e['hit_us']:.1f}) | {r['gather_us']:.1f} ({e['gather_us']:.1f}) "
              f"| {r['miss_GBps']:.1f} | {r['gather_GBps']:.1f} | {r['miss_over_gather']:.2f} "
              f"({e['miss_over_gather']:.2f}) |")
    if a.sweep:
        names = list(sweep_configs(a.k, 1))
        print("\nmiss µs by launch variant (miss/gather in brackets)")
        print("| batch | clustered | default | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(names))
        for r in rows:
            cells = [f"{r['sweep_miss_us'][n]:.1f} ({r['gather_us'] / r['sweep_miss_us'][n]:.2f})" for n in names]
            print(f"| {r['batch']} | {r['clustered']} | {r['miss_us']:.1f} ({r['miss_over_gather']:.2f}) | "
                  + " | ".join(cells) + " |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows}, f,
                      indent=1)
    return rows


if __name__ == "__main__":
    main()
