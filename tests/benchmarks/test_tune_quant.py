"""The packed kernels' tuner (benchmarks/tune_quant.py): shapes, candidates, the keep rule, the table it writes."""
import json

import pytest
import torch
from synodic.kernels.quant_linear.launch import resolve_config

from benchmarks import tune_quant


def test_model_shapes_of_a_preset():
    shapes = tune_quant.model_shapes("tiny_mamba2", "mxfp4")  # 4 MLP layers (relu2: up, down), 4 Mamba-2
    assert shapes[(1024, 384)] == 4 and shapes[(384, 1024)] == 4
    assert all(k % 32 == 0 for _, k in shapes)
    with pytest.raises(ValueError, match="--models 'nope'"):
        tune_quant.model_shapes("nope", "mxfp4")


@pytest.mark.parametrize("M,fmt", [(1, "mxfp4"), (2, "mxfp8_e4m3"), (4, "nvfp4"), (32, "mxfp4")])
def test_candidates(M, fmt):
    cands = tune_quant.candidates(M, 18560, 4096, fmt, 132)
    assert cands[0] == resolve_config(M, 18560, 4096, fmt, None, 132)  # the heuristic first
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands) > 1
    assert all(1 <= c["SPLIT_K"] <= 64 for c in cands)
    assert all(resolve_config(M, 18560, 4096, fmt, c, 132) == c for c in cands)
    if M >= 3:  # the format's other dotp tiles
        assert len({(c["BLOCK_N"], c["BLOCK_K"]) for c in cands}) > 1


def test_choose_keeps_the_heuristic_unless_clearly_faster():
    assert tune_quant.choose({0: [10.0, 10.1, 9.9], 1: [9.8, 9.8, 9.9]}) == 0  # 2 %: noise
    assert tune_quant.choose({0: [10.0, 10.1, 9.9], 1: [9.0, 12.0, 9.1], 2: [9.5, 9.5, 9.5]}) == 1
    assert tune_quant.choose({0: [10.0], 1: [11.0]}) == 0


def test_tune_writes_a_table(tmp_path, device, monkeypatch):
    """The tuner end to end on one small shape (kernels checked against the reference, timer faked): a K split 10 %
    faster than the heuristic's at one row enters the table and resolves unchanged; 1 % at four rows is noise and
    does not; the file carries its meta."""
    import synodic.kernels.quant_linear as ql

    heuristic = {m: resolve_config(m, 64, 1024, "mxfp4", None) for m in (1, 4)}
    seen = {}
    real = ql.quant_linear

    def spy(x, q, *a, config=None, **kw):  # what the timer is about to time
        seen.update(cfg=config, M=x.shape[0])
        return real(x, q, *a, config=config, **kw)

    def timer(fns, calls):
        fns[0]()
        base = heuristic[seen["M"]]
        if seen["cfg"] == base:
            return 10.0
        return 9.0 if seen["M"] == 1 and seen["cfg"]["SPLIT_K"] != base["SPLIT_K"] else 9.9

    monkeypatch.setattr(ql, "quant_linear", spy)
    path = tmp_path / "T.json"
    configs = tune_quant.tune([("mxfp4", 64, 1024)], [1, 4], path, {"gpu": "test"}, device=torch.device(device),
                              time_fn=timer, log=lambda s: None)
    data = json.loads(path.read_text())
    assert data["meta"] == {"runs": [{"gpu": "test"}]} and data["configs"] == configs
    assert list(configs) == ["mxfp4,64,1024,1"]
    cfg = configs["mxfp4,64,1024,1"]
    assert cfg["SPLIT_K"] != heuristic[1]["SPLIT_K"] and resolve_config(1, 64, 1024, "mxfp4", cfg) == cfg
    with pytest.raises(ValueError, match="--ms 3"):
        tune_quant.tune([], [3], path, {}, device=torch.device(device), time_fn=timer)
    tune_quant.tune([("mxfp4", 64, 1024)], [], path, {"gpu": "again"}, device=torch.device(device), time_fn=timer)
    data = json.loads(path.read_text())  # a second run keeps the first's entries and appends its own record
    assert data["meta"] == {"runs": [{"gpu": "test"}, {"gpu": "again"}]} and data["configs"] == configs
