"""KV policies under a speculative verify window (synodic/kv/window.py): greedy speculative output equals plain
greedy output with kv=hisparse|adaptive under host-pool pressure, shared retrieval on and off; a window fetches
exactly the union of its queries' misses; rejected drafts never reach the hot buffer, the reverse map or the
residency stamps; no request is lost when a window cannot get pages; the drafter's context ring is counted by
kv=adaptive's device budget."""
import pytest
import torch
from test_kv_engine import MODEL, PROMPTS, TIERED, TOPK, corrupting_drafter, serve

import synodic.kv.hot as hot_mod
from synodic.config.compose import compose
from synodic.graph import build_graph

PRESSURE = {  # a few device pages: hot-buffer misses (hisparse), demotion mid-run (adaptive)
    "hisparse": ["kv=hisparse", *TIERED, "kv.num_blocks=64", "kv.draft_pages=3"],
    "adaptive": ["kv=adaptive", *TIERED, "kv.num_blocks=20", "kv.tail_pages=3"],
}


@pytest.fixture(scope="module")
def reference():
    _, plain, _ = serve(["kv=resident", *TOPK, "kv.num_blocks=128"], PROMPTS, max_tokens=16)
    return {r.id: r.output_ids for r in plain}


def _spec(kind, reference, shared, gamma=3):
    return serve([*PRESSURE[kind], f"kv.shared_retrieval={str(shared).lower()}"], PROMPTS, max_tokens=16,
                 window=gamma + 1, drafter=corrupting_drafter(reference, gamma))


@pytest.mark.parametrize("kind", ["hisparse", "adaptive"])
def test_speculative_greedy_equals_plain_under_pressure_shared_on_and_off(kind, reference):
    """4-token windows, drafts every third corrupted, in the hisparse configuration whose window fast path raised
    IndexError in kernels/kv_resolve/ref.py (block_size=2, hot_buffer=6, draft_pages=3: a row whose window starts
    at position 5 < B selects position 8, past the 4-page hot table). Both retrieval modes give plain greedy's
    tokens, and the ledger's per-query count is computed exactly beside the fetched one."""
    runs = {shared: _spec(kind, reference, shared) for shared in (True, False)}
    win = {}
    for shared, (eng, reqs, _) in runs.items():
        assert [r.output_ids for r in reqs] == [reference[r.id] for r in reqs], (kind, shared)
        st = eng.graph.kv.stats
        win[shared] = (st["window_fetched_rows"], st["window_per_query_rows"])
    if kind == "adaptive":
        assert runs[True][0].graph.kv.stats["demoted_pages"] > 0
    (f_on, q_on), (f_off, q_off) = win[True], win[False]
    assert q_on == q_off == f_off > 0        # the same misses either way; per-query fetches each query's own
    assert 0 < f_on < q_on                   # shared fetches a row missed by several queries once


def test_window_fetches_exactly_the_union_of_its_queries_misses(reference, monkeypatch):
    """Every window layer: the rows fetched are the union over queries of the selected positions that were neither
    resident nor in the hot buffer when the layer's window began (per-query retrieval: their count per query), every
    id a query gets for a committed position holds that position's row (its host copy), and window positions are
    read from the draft pages."""
    seen = []
    real = hot_mod.resolve_window

    def checked(p, i, sel, res_table, fast, shared):
        sof = p.slot_of[i].clone()
        ids, fetched, per_query = real(p, i, sel, res_table, fast, shared)
        host = p.host.layer(i).view(-1, p.W)
        dev = p.dev_kv(i).reshape(-1, p.W)
        for n, r in enumerate(p.rows.tolist()):
            if r == p.S:
                continue
            union, per = set(), 0
            for t in range(sel.shape[1]):
                for j, pos in enumerate(sel[n, t].tolist()):
                    if pos < 0:
                        continue
                    resident = int(res_table[r, pos // p.bs]) >= 0
                    if pos >= int(p._pos()[n]):  # a window row: in its draft page (its host copy lands later)
                        assert resident
                        continue
                    hrow = int(p.host.rows(torch.tensor(r), torch.tensor(pos)))
                    assert torch.equal(dev[ids[t][n, j]], host[hrow]), (i, n, t, pos)
                    short = fast is not None and bool(fast[n])
                    irow = int(p.idx_blocks.table[r, pos // p.bs]) * p.bs + pos % p.bs
                    if not resident and not short and int(sof.view(-1)[irow]) < 0:
                        union.add(pos)
                        per += 1
            assert int(fetched[n]) == (len(union) if shared else per)
            assert int(per_query[n]) == per
            seen.append(len(union))
        return ids, fetched, per_query

    monkeypatch.setattr(hot_mod, "resolve_window", checked)
    eng, reqs, _ = _spec("hisparse", reference, True)
    assert [r.output_ids for r in reqs] == [reference[r.id] for r in reqs]
    assert sum(seen) > 0


@pytest.mark.parametrize("kind", ["hisparse", "adaptive"])
def test_rejected_drafts_never_enter_the_hot_buffer_or_stamps(kind, reference, monkeypatch):
    """After every commit: no hot slot, reverse-map entry, current selection or page stamp names a position at or
    past the committed length (window rows beyond it were drafts the target rejected)."""
    checks = []
    cls = type(build_graph(compose([*MODEL, *PRESSURE[kind]]), max_seq_len=64, window=4).kv)
    commit = cls.commit

    def checked(self, accepted):
        rows, p0 = self.rows.clone(), self._pos().clone()
        commit(self, accepted)
        for n, r in enumerate(rows.tolist()):
            if r == self.S:
                continue
            end = int(p0[n]) + int(accepted[n])          # committed positions are < end
            assert int(self.hot_pos[:, r, : self.B].max()) < end
            pages = self.idx_blocks.owned.get(r, [])
            sof = self.slot_of[:, pages].flatten(1)        # positions page by page
            pos = torch.arange(sof.shape[1])
            assert bool((sof[:, pos >= end] < 0).all())
            if kind == "adaptive":
                assert int(self.last_sel[:, r].max()) < end
                first_free = -(-end // self.bs)          # pages holding no committed position
                stamps = self.page_stamp[r, first_free: self.max_pages]
                assert stamps.numel() == 0 or int(stamps.max()) < self.step
            checks.append(end)

    monkeypatch.setattr(cls, "commit", checked)
    eng, reqs, _ = _spec(kind, reference, True)
    assert [r.output_ids for r in reqs] == [reference[r.id] for r in reqs]
    assert len(checks) > 10


def test_no_request_lost_when_a_window_cannot_get_pages(reference, monkeypatch):
    """A pool too small for every row's window (resident: device pages; hisparse: host pages): such steps verify no
    drafts (plain steps) and the scheduler preempts; every request finishes with plain greedy's tokens."""
    from synodic.engine.scheduler import Scheduler
    refused = []
    reserve = Scheduler.reserve

    def counted(self, rows, extra, free_only=False):
        ok = reserve(self, rows, extra, free_only)
        refused.append(extra > 1 and not ok)
        return ok
    monkeypatch.setattr(Scheduler, "reserve", counted)
    prompts = [[7 + i] * (10 + i) for i in range(4)]
    _, plain, _ = serve(["kv=resident", *TOPK, "kv.num_blocks=128"], prompts, max_tokens=10)
    ref = {r.id: r.output_ids for r in plain}
    for ov in (["kv=resident", *TOPK, "kv.num_blocks=30"],
               ["kv=hisparse", *TIERED, "kv.num_blocks=12", "kv.draft_pages=3", "kv.host_num_blocks=30"]):
        refused.clear()
        eng, reqs, _ = serve([*ov, "runtime.max_slots=4"], prompts, max_tokens=10, window=4,
                             drafter=corrupting_drafter(ref, 3))
        assert any(refused), ov
        assert all(r.finish_reason == "length" for r in reqs), ov
        assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs], ov


def test_adaptive_budget_counts_the_drafter_ring():
    from synodic.config.errors import ConfigError
    from synodic.kv.drafter_ring import drafter_ring_bytes
    spec = ["spec=dflash", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.context_window=16",
            "runtime.max_slots=2", "kv.drafter_ring_in_budget=true"]
    g = build_graph(compose([*MODEL, *PRESSURE["adaptive"], "kv.num_blocks=40", *spec]), max_seq_len=64)
    ring = drafter_ring_bytes(g.spec)
    kv = g.kv
    page = kv.bs * kv.NL * kv.row_bytes()
    assert ring > 0 and kv.reserved_bytes == ring and kv.reserved_pages == -(-ring // page)
    assert kv.blocks.num_blocks == 40 - kv.reserved_pages and len(kv.free) == 40 - kv.reserved_pages
    assert kv.device_bytes_held() >= ring
    with pytest.raises(ConfigError) as e:
        build_graph(compose([*MODEL, *PRESSURE["adaptive"], f"kv.num_blocks={kv.reserved_pages}", *spec]),
                    max_seq_len=64)
    assert "the draft model's context ring" in e.value.lines[0]
    off = build_graph(compose([*MODEL, *PRESSURE["adaptive"], "kv.num_blocks=40", *spec[:-1]]), max_seq_len=64).kv
    assert off.reserved_pages == 0 and len(off.free) == 40


@pytest.mark.parametrize("kind", ["hisparse", "adaptive"])
def test_neural_drafter_step_commits_the_kv_window(kind):
    """A device drafter's greedy step (ModelRunner.speculate: draft, verify, accept and commit as one forward, a
    CUDA graph on a GPU) commits the KV policy's window too: plain greedy's tokens under hot-buffer pressure."""
    neural = ["spec=dflash", "spec.drafter=random", "spec.num_speculative_tokens=3", "spec.context_window=16",
              "spec.gate=off"]
    _, plain, _ = serve(PRESSURE[kind], PROMPTS, max_tokens=12)
    eng, reqs, _ = serve([*PRESSURE[kind], *neural], PROMPTS, max_tokens=12)
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    assert eng.ledger.summary()["bytes_per_step"]["kv_window_per_query_fetch_bytes"] > 0


@pytest.mark.parametrize("kind", ["hisparse", "adaptive"])
def test_short_views_skip_scoring_in_verify_windows(kind, monkeypatch):
    """top_k >= every view: plain and speculative steps select all visible positions without scoring (the indexer
    only writes keys), and speculative greedy output still equals plain greedy output."""
    from synodic.kv.indexer import KeyIndexer

    def no_scores(*a, **k):
        raise AssertionError("a short view scored its keys")
    monkeypatch.setattr(KeyIndexer, "decode_scores", no_scores)
    wide = ["kv.top_k=64", "kv.block_size=2"]
    _, plain, _ = serve(["kv=resident", *wide, "kv.num_blocks=128"], PROMPTS, max_tokens=16)
    ref = {r.id: r.output_ids for r in plain}
    tiered = ["kv.hot_buffer=64", "kv.host_num_blocks=256", "kv.index_num_blocks=256", "kv.num_blocks=128",
              "kv.draft_pages=3" if kind == "hisparse" else "kv.tail_pages=3"]
    eng, reqs, _ = serve([f"kv={kind}", *wide, *tiered], PROMPTS, max_tokens=16, window=4,
                         drafter=corrupting_drafter(ref, 3))
    assert [r.output_ids for r in reqs] == [ref[r.id] for r in reqs]
    assert eng.spec_stats.accepted > 0
