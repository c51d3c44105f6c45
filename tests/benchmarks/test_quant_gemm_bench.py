"""benchmarks/quant_gemm.py without a GPU: the shapes it times and the tc configs it tries per row count."""
import json

import pytest
import triton
from synodic.kernels.quant_linear.launch import resolve_config, tc_config

from benchmarks import quant_gemm


def test_shapes_bench_shape_first_then_heaviest():
    shapes = quant_gemm.shapes_of(["tiny_mamba2"], 3)
    assert shapes[0] == quant_gemm.BENCH_SHAPE and len(shapes) == 3 and (1024, 384) in shapes


@pytest.mark.parametrize("M,fmt", [(2, "mxfp4"), (16, "nvfp4"), (64, "mxfp8_e4m3"), (256, "mxfp4")])
def test_tc_candidates(M, fmt):
    cands = quant_gemm.tc_candidates(M, fmt)
    assert cands[0] == tc_config(M, fmt)  # the heuristic first
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands) > 3
    assert all(c["KERNEL"] == "tc" and c["BLOCK_M"] <= max(16, triton.next_power_of_2(M)) for c in cands)
    for c in cands:  # each resolves to a launchable tc config (the K step of its format, a tile of powers of two)
        full = resolve_config(M, 14336, 4096, fmt, c, 132)
        assert full["BLOCK_K"] == (128 if fmt in ("mxfp4", "nvfp4") else 64) and full["SPLIT_K"] >= 1
    assert {c["SWAP"] for c in cands} == {0, 1}


@pytest.mark.parametrize("kgemm", [False, True])
def test_time_kernel_checks_then_times_each_layout(kgemm):
    """time_kernel on a small CPU cell (the interpreter): the stored layout or kgemm's packed copies, checked against
    the reference, then handed to the timer (the plane layout packed once, on first use)."""
    import torch

    from synodic.quant import quantize

    class Cell:  # the attributes time_kernel reads
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.s = torch.rand(256, generator=g) + 0.5
            self.qs = [quantize(torch.randn(64, 256, generator=g) / self.s, "mxfp4") for _ in range(2)]
            self.ks = None

    cell, timed = Cell(), []
    x = torch.randn(5, 256)
    r = quant_gemm.time_kernel(cell, x, None, lambda fns: timed.append([f() for f in fns]) or 1.5, kgemm)
    assert r["us"] == 1.5 and r["err"] < 1e-4 and len(timed[0]) == 2
    assert (cell.ks is not None) == kgemm
