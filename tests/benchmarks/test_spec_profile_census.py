"""benchmarks.spec_profile --census on the CPU: one speculative step's GEMMs carry the module that ran them, the
drafter's call into the target's LM head counts as the drafter's, and the table and JSON are written."""
import json

import pytest

from benchmarks.spec_profile import GEMMS, main


@pytest.mark.parametrize("spec,drafter_only", [("dflash2", "drafter.selector.H"), ("dspark", "drafter.markov.W2")])
def test_census_attributes_every_gemm(tmp_path, spec, drafter_only):
    out = tmp_path / "census.txt"
    main(["--census", "--specs", spec, "--device", "cpu", "--step", "2", "--out", str(out)])
    c = json.loads(out.with_suffix(".json").read_text())[spec]
    gemms = c["gemms"]
    owners = {g["owner"] for g in gemms}
    assert owners == {"target", "drafter"}
    assert sum(c["ops"]["target"].get(k, 0) + c["ops"]["drafter"].get(k, 0) for k in GEMMS) == len(gemms)
    heads = [g for g in gemms if g["module"].endswith("target.lm_head")]
    # the verify's LM head over the 1 + γ window is the target's; the drafter's block rows (γ) run it too
    assert sorted((g["owner"], g["shapes"][0][1]) for g in heads) == [("drafter", 7), ("target", 8)]
    assert any(g["module"] == drafter_only and g["owner"] == "drafter" for g in gemms)
    assert all(g["module"].startswith(("target", "drafter")) and g["flops"] > 0 and g["dtype"] for g in gemms)
    text = out.read_text()
    assert f"spec={spec}" in text and "GEMMs by owner: drafter" in text and "all ops by owner:" in text


def test_census_counts_kernels_not_views(tmp_path):
    """The step's non-GEMM kernels: a kernel package's reference counts as its one launch (the verify window's
    conv and its commit once per SSM layer, DFlash2's dynamic conv once per convolution), views and no-op casts
    count as no kernel, and the total stays under the bound the fused step meets (394 before the conv / commit /
    dynamic-conv kernels, 258 with them, 207 with DFlash2's path table: tiny_mamba2, γ = 3)."""
    out = tmp_path / "census.txt"
    main(["--census", "--specs", "dflash2", "--device", "cpu", "--over", "spec.num_speculative_tokens=3",
          "--out", str(out)])
    c = json.loads(out.with_suffix(".json").read_text())["dflash2"]
    ssm_layers = "M-M*-M-M*-".count("M")  # tiny_mamba2's pattern
    per = {}
    for key, n in c["kernels"].items():
        name = key.split(" | ")[-1]
        per[name] = per.get(name, 0) + n
    assert per["triton:conv1d_window"] == per["triton:conv1d_window_commit"] == ssm_layers
    assert per["triton:dynamic_conv"] == 2 * 4  # two draft layers, four convolutions each
    assert not {"view", "unsqueeze", "select", "slice", "expand"} & set(per)
    kinds = c["kinds"]
    total = sum(v.get("kernel", 0) for v in kinds.values())
    assert total == sum(c["kernels"].values()) and total <= 230
    assert "non-GEMM kernels per step:" in out.read_text()


def test_census_dflash2_walk_costs_one_lookup_a_position(tmp_path):
    """DFlash2's drafts come from one table of path scores (PathSelector.path_table), so a longer block adds one
    index lookup a position to the drafter's kernels, not the per-position score kernels of a step loop
    (γ = 7 against γ = 3: +4 here, +28 with the loop)."""
    counts = {}
    for g in (3, 7):
        out = tmp_path / f"census{g}.txt"
        main(["--census", "--specs", "dflash2", "--device", "cpu", "--over", f"spec.num_speculative_tokens={g}",
              "--out", str(out)])
        counts[g] = json.loads(out.with_suffix(".json").read_text())["dflash2"]["kinds"]["drafter"]["kernel"]
    assert 0 < counts[7] - counts[3] <= 7, counts
