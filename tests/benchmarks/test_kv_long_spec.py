"""Long-context speculation under KV residency (benchmarks/kv_long_spec.py) in its CPU smoke form: every variant at
both loads, forced acceptance, contexts seeded by the fill, identical outputs (plain) and target verify digests
(forced) across policies, the fetch accounting the targets read; and the GPU plan fits the machine."""
import pytest
from kv_long_written import assert_written

from benchmarks import kv_long_spec as ls


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("long_spec") / "smoke.json"
    return ls.main(["--smoke", "--device", "cpu", "--out", str(out)]), out


def test_smoke_runs_every_variant_with_seeded_contexts(smoke):
    res, out = smoke
    rows = {(r["load"], r["variant"]): r for r in res["rows"]}
    variants = ls.VARIANTS.split(",")
    assert set(rows) == {(ld, v) for ld in ls.LOADS for v in variants}
    assert not [r for r in rows.values() if "error" in r or "warning" in r], [
        (r.get("error"), r.get("warning")) for r in rows.values()]
    assert not res["skipped"]
    # the distinct prompts were prefilled once, for the reference; every measured request was replayed
    assert res["reference"]["prefill"]["real"] == res["args"]["distinct"]
    assert res["model"]["drafter_ring_bytes"] == res["model"]["drafter_ring_planned"] > 0  # the plan's ring cost
    for r in rows.values():
        n = res["loads"][r["load"]]["requests"]
        assert r["fill"] == {**r["fill"], "real": 0, "replayed": n}
        assert r["max_running"] == n and r["preemptions"] == 0
        assert r["decode_tokens_per_s"] > 0 and r["timed_steps"] == res["args"]["steps"]
        assert r["selected_rows"] > 0 and 0 <= r["fetch_fraction"] <= 1
        if r["spec"]:  # forced 0.8 per position: more than one token per row and step, never past the reference
            assert 1.5 < r["tokens_per_row_step"] <= res["args"]["gamma"] + 1
            assert r["acceptance"] == "forced" and r["uncontrolled_drafts"] == 0 and r["outputs_match_reference"]
            assert r["verify_digest"]["hash"] != 0
        else:
            assert r["tokens_per_row_step"] == 1.0
    assert_written(res, out, [(ld, v) for ld in ls.LOADS for v in variants])


def test_smoke_identical_across_policies(smoke):
    res, _ = smoke
    for ld in ls.LOADS:
        ident = res["loads"][ld]["identical"]
        assert ident["plain"]["all"] and ident["plain"]["outputs"]["policies"] == ["adaptive", "hisparse"]
        assert ident["spec"]["verify_identical"] and ident["spec"]["all"], ident["spec"]


def test_smoke_fetch_accounting(smoke):
    res, _ = smoke
    rows = {(r["load"], r["variant"]): r for r in res["rows"]}
    for ld in ls.LOADS:
        for v in ("hisparse", "hisparse+spec"):  # the hot buffer misses at every load
            assert rows[(ld, v)]["host_fetched_rows"] > 0 and rows[(ld, v)]["host_fetch_bytes_per_step"] > 0
    # low load: adaptive holds every request resident and fetches nothing
    for v in ("adaptive", "adaptive+spec"):
        assert rows[("low", v)]["host_fetched_rows"] == 0 and rows[("low", v)]["resident_page_fraction"] == 1.0
    # moderate load: the speculative adaptive pool (staging rows, ring) is short of full residency: it demotes,
    # and fetches only what it demoted
    m = rows[("moderate", "adaptive+spec")]
    assert res["loads"]["moderate"]["plans"]["adaptive+spec"]["pool_over_demand"] < 1
    assert m["demoted_pages"] > 0 and m["resident_page_fraction"] < 1
    assert 0 < m["fetch_fraction"] < rows[("moderate", "hisparse+spec")]["fetch_fraction"]
    t = res["targets"]
    assert t["adaptive_spec_fetch_fraction_low"]["met"] is True and t["adaptive_fetch_fraction_low"]["met"] is True
    for k in ("adaptive_spec_over_hisparse_spec_moderate", "adaptive_spec_over_adaptive_moderate"):
        assert t[k]["value"] > 0


def test_gpu_plan_fits_the_h200():
    """The default GPU command's sizing (no model built): 64 x 32K contexts, adaptive demotes at the moderate load
    and holds everything at the low one, the host pool fits the machine's RAM pinned once."""
    p = ls.main(["--plan-only"])
    assert not p["problems"] and not p["warnings"], (p["problems"], p["warnings"])
    mod, low = p["plans"]["moderate"], p["plans"]["low"]
    assert 0.6 < mod["adaptive+spec"]["pool_over_demand"] < 0.9
    assert low["adaptive+spec"]["requests_fully_resident"] >= 48 and low["adaptive"]["requests_fully_resident"] >= 48
    assert mod["hisparse+spec"]["draft_pages"] == 2
    assert p["ppr"] * p["shape"]["block_size"] <= 32768 and p["ppr"] * 64 >= 32000  # a 32K context, 512-page view
    assert 60e9 < p["host_bytes"] < 90e9
    assert p["budget"] + p["weights_estimate"] + p["record_bytes"] < 120e9
