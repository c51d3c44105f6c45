"""benchmarks/quant_kgemm.py (`quant_gemm --kgemm`) without a GPU: its candidate configs, the rows it suggests for
KGEMM_ROWS, the tuned section it writes and merges, its bad-input exit."""
import json

import pytest
from synodic.kernels.quant_linear.kgemm_launch import resolve_kgemm_config

from benchmarks import quant_gemm, quant_kgemm


@pytest.mark.parametrize("M,fmt", [(1, "mxfp4"), (16, "nvfp4"), (64, "mxfp8_e4m3"), (256, "mxfp4")])
def test_candidates(M, fmt):
    cands = quant_kgemm.candidates(M, 14336, 16, fmt, 132)
    t = quant_kgemm.tiles(M)[0]
    assert (cands[0]["BLOCK_M"], cands[0]["BLOCK_N"], cands[0]["SWAP"]) == t[:3]
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands) >= len(quant_kgemm.tiles(M))
    assert all(resolve_kgemm_config(M, 14336, 16, fmt, c, 132) == c for c in cands)
    assert len(cands) <= 7  # the time budget: a handful a point


def _row(fmt, M, x_bf16, x_route, N=64):
    return {"format": fmt, "M": M, "N": N, "K": 512, "kgemm_x_bf16": x_bf16, "kgemm_x_route": x_route,
            "kgemm_config": {"BLOCK_M": 16}}


def test_suggest_rows_needs_every_shape_and_both_paths():
    ms = [1, 2, 4, 8, 16, 32, 64]
    rows = [_row("mxfp4", M, 1.5, 1.2) for M in ms]
    # the second shape: 8 rows only 1 % ahead of the current route, 64 rows behind bf16
    rows += [_row("mxfp4", M, {64: 0.9}.get(M, 1.5), {8: 1.01}.get(M, 1.2), N=128) for M in ms]
    rows += [_row("nvfp4", M, 0.9, 1.5) for M in ms]  # loses to bf16: never suggested
    assert quant_kgemm.suggest_rows(rows, ms) == {"mxfp4": [2, 4]}  # runs 2-4 and 16-32 tie: the first
    rows = [r for r in rows if not (r["M"] == 2 and r["N"] == 128)]  # a shape not measured at 2 rows: no claim
    rows.append(_row("mxfp4", 2, 1.5, 1.0, N=128))
    assert quant_kgemm.suggest_rows(rows, ms) == {"mxfp4": [16, 32]}


def test_section_and_apply(tmp_path):
    rows = [_row("mxfp4", 1, 2.0, 2.0), _row("mxfp4", 8, 2.0, 2.0), _row("mxfp4", 24, 2.0, 2.0)]
    sec = quant_kgemm.kgemm_section(rows)
    assert sec == {"mxfp4,64,512,8": {"BLOCK_M": 16}}  # row buckets only
    table = tmp_path / "T.json"
    table.write_text(json.dumps({"meta": {"runs": []}, "configs": {"a": {}}, "gemm": {"b": {}},
                                 "kgemm": {"mxfp4,64,512,2": {"BLOCK_N": 64}}}))
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"gpu": "G", "date": "d", "command": "c", "kgemm_section": sec}))
    quant_gemm.main(["--apply-kgemm", str(res), "--table", str(table)])
    data = json.loads(table.read_text())
    assert data["configs"] == {"a": {}} and data["gemm"] == {"b": {}} and len(data["meta"]["runs"]) == 1
    assert data["kgemm"] == {"mxfp4,64,512,2": {"BLOCK_N": 64}, "mxfp4,64,512,8": {"BLOCK_M": 16}}


def test_bad_format_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        quant_gemm.main(["--kgemm", "--formats", "mxfp4,int4_g64"])
    assert e.value.code == 2 and "--formats 'int4_g64'" in capsys.readouterr().err


def test_bench_shape_smoke(monkeypatch):
    """One shape, format and row count end to end on the CPU (interpreter kernels; times are NaN there): every
    candidate is checked against the reference and recorded, the row has the fields the summary reads."""
    import torch
    monkeypatch.setattr(quant_kgemm, "DEV", "cpu")
    monkeypatch.setattr(quant_kgemm, "_copies", lambda nbytes: 2)
    monkeypatch.setitem(quant_kgemm._TILES, 16, quant_kgemm._TILES[16][:2])
    gen = torch.Generator().manual_seed(0)
    rows = quant_kgemm.bench_shape(128, 512, [2], ["mxfp4"], gen, float("inf"), lambda m: None)
    (row,) = rows
    # 2 tiles; 2 groups leave no split variant
    assert row["M"] == 2 and row["route"] == "stored" and len(row["kgemm_tried"]) == 2
    assert all(t["err"] < 1e-2 for t in row["kgemm_tried"]) and row["stored_err"] < 1e-2
    assert "kgemm_config" in row and row["stored_config"]["KERNEL"] == "gemvh"


def test_precompile_is_bounded():
    """The parallel warm-up returns by its limit (slow or hung workers are terminated) and reports what it cut."""
    import time
    t0 = time.monotonic()
    out = quant_kgemm.precompile([(256, 1024)], ["mxfp4"], [2], 1, lambda m: None, limit_s=0.2)
    # spawned workers import torch for longer than 0.2 s: every job is still pending at the limit
    assert time.monotonic() - t0 < 15 and out["cut_off"] == out["jobs"] == 4  # 3 kgemm chunks + 1 stored shape
