"""The per-step choice of cuBLAS front end (synodic/engine/blas.py)."""
import pytest
import torch

from synodic.engine.blas import blas_for, prefers_lt

CUDA = torch.device("cuda")


@pytest.mark.parametrize("rows, dtype, want", [
    (1, torch.float32, False), (2, torch.float32, True), (8, torch.float32, True), (16, torch.float32, True),
    (17, torch.float32, False), (256, torch.float32, False), (8, torch.bfloat16, False)])
def test_cublaslt_only_for_fp32_steps_of_2_to_16_rows(rows, dtype, want, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert prefers_lt(rows, dtype, CUDA) is want
    assert not prefers_lt(rows, dtype, torch.device("cpu"))


def test_rocm_keeps_its_library(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not prefers_lt(8, torch.float32, CUDA)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_library_is_restored_after_the_step():
    before = torch.backends.cuda.preferred_blas_library()
    x, w = torch.randn(8, 384, device="cuda"), torch.randn(128, 384, device="cuda")
    with blas_for(8, torch.float32, CUDA):
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
        y = torch.nn.functional.linear(x, w)
    assert torch.backends.cuda.preferred_blas_library() == before
    torch.testing.assert_close(y, x.double().mm(w.double().T).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_route_benchmark_times_every_shape(tmp_path, monkeypatch):
    from benchmarks import blas_route
    monkeypatch.setattr(blas_route, "SHAPES", [(384, 128)])
    monkeypatch.setattr(blas_route, "ROWS", [1, 8])
    blas_route.main(["--out", str(tmp_path / "b.json")])
    import json
    us = json.loads((tmp_path / "b.json").read_text())["us"]
    assert [r["rows"] for r in us] == [1, 8] and all(r["cublas"] > 0 and r["cublaslt"] > 0 for r in us)
