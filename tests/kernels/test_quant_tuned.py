"""The per-GPU tuned config tables of the packed kernels (quant_linear/tuned.py)."""
import json

import pytest
import torch
from synodic.kernels.quant_linear import KERNEL_FORMATS, tuned
from synodic.kernels.quant_linear.launch import resolve_config


def test_buckets():
    assert [tuned.bucket(m) for m in (1, 2, 3, 4, 5, 16, 17, 32, 33)] == [1, 2, 4, 4, 16, 16, 32, 32, None]


def test_table_path_and_lookup(tmp_path):
    assert tuned.table_path("NVIDIA H200 (x)", tmp_path).name == "NVIDIA_H200_x.json"
    cfg = dict(KERNEL="dotp", BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, SEM=True, num_warps=4, num_stages=3)
    tuned.table_path("GPU A", tmp_path).write_text(json.dumps({"meta": {}, "configs": {"nvfp4,96,256,4": cfg}}))
    tuned.load.cache_clear()
    got = tuned.lookup("GPU A", "nvfp4", 96, 256, 3, tmp_path)  # M = 3 takes the 4-row entry
    assert got == cfg and got is not cfg  # a copy: callers may not edit the table
    assert tuned.lookup("GPU A", "nvfp4", 96, 256, 5, tmp_path) is None  # bucket 16: no entry
    assert tuned.lookup("GPU A", "nvfp4", 96, 256, 33, tmp_path) is None  # above the last bucket
    assert tuned.lookup("GPU A", "mxfp4", 96, 256, 4, tmp_path) is None
    assert tuned.lookup("GPU B", "nvfp4", 96, 256, 4, tmp_path) is None  # no table for this device


def test_malformed_table_is_refused(tmp_path):
    p = tuned.table_path("Bad GPU", tmp_path)
    p.write_text(json.dumps({"configs": ["not", "a", "dict"]}))
    tuned.load.cache_clear()
    with pytest.raises(ValueError, match="Bad_GPU.json"):
        tuned.lookup("Bad GPU", "mxfp4", 64, 64, 1, tmp_path)


def test_tuned_config_only_for_cuda_low_precision_calls():
    from synodic.kernels.quant_linear.launch import tuned_config

    assert tuned_config(2, 4096, 8192, "mxfp8_e4m3", torch.device("cpu")) is None
    assert tuned_config(2, 4096, 8192, "mxfp8_e4m3", torch.device("cuda"), fp32_act=True) is None


def test_shipped_tables_are_valid():
    """Every shipped entry names a kernel format, a tuned row bucket, and a launch config that resolve_config takes
    unchanged (no unknown key, a known kernel, its tile and split as tuned)."""
    for path in sorted(tuned.TABLE_DIR.glob("*.json")):
        configs = tuned.load.__wrapped__(path)
        for k, cfg in configs.items():
            fmt, N, K, M = k.split(",")
            assert fmt in KERNEL_FORMATS and int(M) in tuned.M_BUCKETS, (path.name, k)
            assert resolve_config(int(M), int(N), int(K), fmt, cfg) == cfg, (path.name, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the table is read for CUDA calls only")
def test_table_entry_reaches_the_launch(tmp_path, monkeypatch):
    """A call without a config takes this GPU's table entry: a deliberately invalid one is refused by the launcher."""
    from synodic.kernels.quant_linear import quant_linear
    from synodic.kernels.quant_linear.launch import _device_name

    from synodic.quant import quantize

    dev = torch.device("cuda")
    q = quantize(torch.randn(96, 256, device=dev), "mxfp4")
    x = torch.randn(1, 256, device=dev).to(torch.bfloat16)
    bad = dict(KERNEL="gemvh", BLOCK_N=32, BLOCK_K=48, SPLIT_K=1, SEM=True, num_warps=4, num_stages=2)
    monkeypatch.setattr(tuned, "TABLE_DIR", tmp_path)
    tuned.table_path(_device_name(dev)).write_text(json.dumps({"meta": {}, "configs": {"mxfp4,96,256,1": bad}}))
    tuned.load.cache_clear()
    try:
        with pytest.raises(ValueError, match="BLOCK_K=48"):
            quant_linear(x, q, backend="triton")
        quant_linear(torch.randn(2, 256, device=dev).to(torch.bfloat16), q, backend="triton")  # no entry: heuristic
    finally:
        tuned.load.cache_clear()
