"""benchmarks/quant_gemm.py without a GPU: the shapes it times, the GEMM tuning space, the table section it writes."""
import json

import pytest
from synodic.kernels.quant_linear.launch import resolve_gemm_config

from benchmarks import quant_gemm


def test_shapes_bench_shape_first_then_heaviest():
    shapes = quant_gemm.shapes_of(["tiny_mamba2"], 3)
    assert shapes[0] == quant_gemm.BENCH_SHAPE and len(shapes) == 3 and (1024, 384) in shapes


@pytest.mark.parametrize("M,fmt", [(2, "mxfp4"), (16, "nvfp4"), (64, "mxfp8_e4m3"), (256, "mxfp4")])
def test_gemm_candidates(M, fmt):
    cands = quant_gemm.gemm_candidates(M, 14336, 4096, fmt, 132)
    assert cands[0] == resolve_gemm_config(M, 14336, 4096, fmt, None, 132)  # the heuristic first
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands) > 3
    assert all(resolve_gemm_config(M, 14336, 4096, fmt, c, 132) == c for c in cands)
    swaps = {c["SWAP"] for c in cands}
    assert swaps == ({1} if M < 32 else {0} if M > 64 else {0, 1})


def test_write_table_keeps_other_sections(tmp_path):
    path = tmp_path / "T.json"
    path.write_text(json.dumps({"meta": {"runs": [{"gpu": "a"}]}, "configs": {"mxfp4,1,2,4": {"KERNEL": "dotp"}}}))
    quant_gemm.write_table(path, {"gpu": "b"}, {"mxfp4,64,512,8": {"KERNEL": "gemm"}})
    quant_gemm.write_table(path, {"gpu": "b"}, {"mxfp4,64,512,8": {"KERNEL": "gemm"}, "nvfp4,64,512,2": {}})
    data = json.loads(path.read_text())
    assert data["configs"] == {"mxfp4,1,2,4": {"KERNEL": "dotp"}}
    assert data["meta"]["runs"] == [{"gpu": "a"}, {"gpu": "b"}] and len(data["gemm"]) == 2
