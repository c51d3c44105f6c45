"""The long-context KV-residency benchmark (synodic/kv/bench_long.py) in its CPU smoke form: every policy
at every load, exact outputs, the fetch and admission orderings it exists to show; and the pool sizing
it reports matches what the policies really allocate."""
from types import SimpleNamespace

import pytest
import torch
from kv_long_written import assert_written

from benchmarks import kv_long as bl


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_long") / "smoke.json"
    res = bl.main(["--smoke", "--device", "cpu", "--out", str(out)])
    return res, out


def test_smoke_covers_every_policy_and_load(smoke):
    res, out = smoke
    rows = {(r["load"], r["kv"]): r for r in res["rows"]}
    assert set(rows) == {(ld, k) for ld in bl.LOADS for k in bl.POLICIES}
    assert not [r for r in rows.values() if "error" in r], [r.get("error") for r in rows.values()]
    assert not res["skipped"]
    for r in rows.values():  # every request ran to its full length, none refused
        assert r["finish_reasons"] == {"length": res["loads"][r["load"]]["requests"]}, r
        assert r["output_tokens"] == r["requests"] * res["args"]["output_len"]
        assert r["decode_tokens_per_s"] > 0 and r["tpot_ms"] > 0 and r["ttft_ms"] > 0
        assert r["cuda_graphs"] is False and r["prefills"] >= r["requests"]
    # written next to each other, and the table has a line per (load, policy)
    assert_written(res, out, [(ld, k) for ld in bl.LOADS for k in bl.POLICIES])


def test_smoke_outputs_identical_across_policies(smoke):
    res, _ = smoke
    for ld in bl.LOADS:
        ident = res["loads"][ld]["identical"]
        assert sorted(ident["policies"]) == sorted(bl.POLICIES)
        assert ident["all"] and all(ident["pairs"].values()), ident


def test_smoke_fetch_and_admission_orderings(smoke):
    res, _ = smoke
    rows = {(r["load"], r["kv"]): r for r in res["rows"]}
    low = res["loads"]["low"]["requests"]
    # low load: everything fits; hisparse still misses its hot buffer, adaptive stays resident
    assert rows[("low", "hisparse")]["host_fetched_rows"] > 0
    assert rows[("low", "adaptive")]["fetch_fraction"] <= rows[("low", "hisparse")]["fetch_fraction"]
    assert rows[("low", "adaptive")]["host_fetched_rows"] == 0
    assert all(rows[("low", k)]["max_running"] == low for k in bl.POLICIES)
    # moderate and high load: resident queues requests, the host-tiered policies admit them all
    for ld, lo, hi in (("moderate", 0.6, 0.9), ("high", 0.4, 0.65)):
        n = res["loads"][ld]["requests"]
        assert rows[(ld, "resident")]["max_running"] < rows[(ld, "hisparse")]["max_running"] == n
        assert rows[(ld, "adaptive")]["max_running"] == n
        assert rows[(ld, "resident")]["host_fetched_rows"] == 0
        assert rows[(ld, "adaptive")]["demoted_pages"] > 0
        assert lo <= res["loads"][ld]["plans"]["resident"]["pool_over_demand"] <= hi
    # the more memory per request, the fewer fetches adaptive needs; hisparse's do not depend on the load
    assert rows[("moderate", "adaptive")]["fetch_fraction"] < rows[("high", "adaptive")]["fetch_fraction"]
    t = res["targets"]
    assert t["resident_refuses_at_moderate"]["value"] is True and t["hot_policies_admit_all_moderate"]["value"] is True


def _device_bytes(pol) -> int:
    """Bytes of every tensor a policy holds, its host pool excepted (what the plan calls device bytes)."""
    seen, total = set(), 0
    host = getattr(pol, "host", None)
    skip = {id(host.data)} if host is not None else set()

    def walk(o):
        nonlocal total
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()  # views (a policy's per-layer pages in one pool tensor) count once
            if id(o) not in skip and st.data_ptr() not in seen and o.numel():
                seen.add(st.data_ptr())
                total += st.nbytes()
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)
        elif type(o).__module__.startswith("synodic.kv") and not isinstance(o, torch.nn.Module) and id(o) not in seen:
            seen.add(id(o))
            for x in vars(o).values():
                walk(x)
    walk(pol)
    return total


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("kind", bl.POLICIES)
@pytest.mark.parametrize("indexer", ["bf16", "fp8", "learned-fp8", "learned-bf16"])
def test_plan_matches_what_the_policy_allocates(kind, indexer, window):
    """window 4: a policy built for speculative verify windows (staging rows; hisparse's draft pages)."""
    from benchmarks.kv_measure import _Model
    NL, nkv, hd, slots, prompt, out, bs, k, d_i = 3, 1, 48, 3, 200, 8, 8, 8, 16
    ix, _, key_dtype = indexer.partition("-")
    model = _Model(NL, 4, nkv, hd)
    if ix == "learned":  # attention layers carrying a learned indexer (H_I heads of d_I dims)
        for m in model.attention_layers:
            m.indexer = SimpleNamespace(n_heads=2, head_dim=d_i)
    sh = bl.Shape(layers=NL, nkv=nkv, head_dim=hd, dtype_bytes=4, block_size=bs, top_k=k, hot_buffer=2 * k,
                  indexer=ix, index_head_dim=d_i, learned_key_dtype=key_dtype or "fp8", max_slots=slots,
                  max_pages=-(-(prompt + out + 1) // bs), tail_pages=2, cuda=False)
    ppr = bl.pages_per_request(prompt, out, bs)
    budget = 400_000
    plan = bl.plan_pool(kind, sh, budget, 3, ppr, window)
    a = SimpleNamespace(block_size=bs, top_k=k, indexer="auto" if ix == "learned" else ix, hot_buffer=2 * k,
                        tail_pages=2, learned_key_dtype=key_dtype or "fp8")
    pol = bl.kv_config(kind, a, plan).build(SimpleNamespace(model=model, device=torch.device("cpu"), max_slots=slots,
                                                            max_seq_len=prompt + out + 1, window=window))
    assert pol.indexer.row_bytes() == sh.index_row
    held = _device_bytes(pol)
    assert plan["planned_device_bytes"] <= budget
    assert abs(held - plan["planned_device_bytes"]) <= 64, (held, plan)
    if kind != "resident":
        assert pol.host.nbytes() == plan["host_bytes"]


def test_compare_outputs_judges_the_policies_that_ran():
    from benchmarks.kv_long import compare_outputs
    same = compare_outputs({"hisparse": [[1, 2]], "adaptive": [[1, 2]]})
    assert same["all"] and same["pairs"] == {"hisparse=adaptive": True}
    diff = compare_outputs({"resident": [[1, 2]], "hisparse": [[1, 3]], "adaptive": [[1, 2]]})
    assert not diff["all"] and diff["mismatches"]["resident=hisparse"]["first_token"] == 1
    assert not compare_outputs({"adaptive": [[1]]})["all"]  # nothing to compare


def test_distilled_checkpoint_with_heldout_prompts(tmp_path):
    """--weights DIR (a kv.locality --save-distilled checkpoint) and --prompts heldout: the trained model selects
    with its distilled indexers over real text; every request runs to its length."""
    from benchmarks.kv_locality import main as locality
    ck = tmp_path / "ck"
    assert locality(["--out", str(tmp_path / "l.json"), "--tokens", "64", "--steps", "8", "--top-k", "8",
                     "--distill-steps", "2", "--save-distilled", str(ck)]) == 0
    res = bl.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "b.json"), "--model", "tiny_mamba2",
                   "--weights", str(ck), "--prompts", "heldout", "--loads", "low", "--policies", "hisparse",
                   "--no-warmup"])
    assert res["shape"]["indexer"] == "learned" and res["shape"]["layers"] == 2
    (row,) = res["rows"]
    assert row["finish_reasons"] == {"length": row["requests"]} and 0 <= row["fetch_fraction"] <= 1


def test_heldout_prompts_are_consecutive_text():
    from synodic.engine.text import load_codec
    codec = load_codec(None)
    p = bl.heldout_prompts(codec, 3, 50)
    assert [len(x) for x in p] == [50, 50, 50] and p[0] != p[1]
    with pytest.raises(SystemExit, match="--prompt-len"):
        bl.heldout_prompts(codec, 2, 10**8)


def test_no_overlap_runs_synced_steps_with_the_same_tokens_and_fetches(smoke, tmp_path):
    """--no-overlap (the A/B of overlapped steps): one host sync per step, the same outputs and host fetches."""
    res, _ = smoke
    off = bl.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "off.json"), "--loads", "moderate",
                   "--policies", "hisparse,adaptive", "--no-overlap"])
    on = {r["kv"]: r for r in res["rows"] if r["load"] == "moderate"}
    for r in off["rows"]:
        assert r["overlapped_steps"] == 0 < on[r["kv"]]["overlapped_steps"]
        assert r["host_fetched_rows"] == on[r["kv"]]["host_fetched_rows"] > 0
        assert r["output_tokens"] == on[r["kv"]]["output_tokens"]


def test_failed_row_frees_what_the_failed_run_held():
    """A variant that raises must not keep its engine (and so its pool) alive through the traceback's frames,
    or every later variant runs out of device memory."""
    import weakref

    class Pool:
        pass
    graph = SimpleNamespace(kv=None, device=torch.device("cpu"))
    logs = []

    def run():
        pool = Pool()
        ref.append(weakref.ref(pool))
        raise RuntimeError("capture refused")
    ref = []
    try:
        run()
    except RuntimeError as e:
        row = bl.failed_row(graph, {"variant": "x"}, e, lambda *a, **k: logs.append(a), "x")
        assert ref[0]() is None, "the failed run's locals outlive failed_row"
    assert row["error"] == "RuntimeError: capture refused" and "capture refused" in row["traceback"] and logs
