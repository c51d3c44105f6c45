"""The timing harness every benchmark shares: one CUDA-graph timer, one copy-rate probe, and the
reference copy rate the ledger's bandwidth figures are quoted against (docs/measuring.md)."""
from collections.abc import Callable, Sequence

import torch

# H200 device-to-device copy, read + write bytes counted (`copy_gbps` on that GPU): the ceiling a
# bandwidth-bound kernel is compared with. Benchmarks also probe it in their own run.
COPY_GBPS_H200 = 4245.0


def graph_us(fns: Sequence[Callable[[], object]] | Callable[[], object], calls: int | None = None,
             warmup_ms: int = 25, rep_ms: int = 200) -> float:
    """Median time per call, in µs, of `calls` calls cycling over `fns`, captured in one CUDA graph (so
    launch overhead is excluded and inputs rotate as the caller arranged). Every fn runs once on a side
    stream first (compiles, autotunes). Default calls: one per fn."""
    if not torch.cuda.is_available():
        return float("nan")  # CPU smoke runs of the benchmarks check results only
    import triton.testing
    fns = [fns] if callable(fns) else list(fns)
    calls = calls or len(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    ms = triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return ms * 1e3 / calls


def copy_gbps(nbytes: int, device="cuda") -> float:
    """Measured device-to-device copy rate over a buffer of `nbytes` (read + write counted), GB/s."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    us = graph_us(lambda: dst.copy_(src))
    return 2 * src.numel() / (us * 1e3)
