"""kv_resolve: Triton kernel vs torch reference, exactly (ids, miss counts, every state tensor, every
copied row), over several steps of a tiny hisparse-style and adaptive-style state with hits, misses,
evictions, the newest-token slot, the short-sequence fast path, resident pages and padding rows; and
the invariant both must keep: the row behind every returned id holds the selected position's KV."""
import pytest
import torch
from synodic.kernels.kv_resolve import kv_resolve
from synodic.kernels.kv_resolve.triton_impl import ResolveScratch, kv_resolve_triton

BS, B, K, W = 3, 7, 5, 6  # odd page size, hot buffer, top-k and row width
S = 4                      # 3 request slots + the scratch slot (index 3)


def build(gen, device, adaptive):
    MP = 8                                  # logical pages per slot (24 positions)
    hp = -(-(B + 1) // BS)
    src = torch.randn(S * MP, BS, W, generator=gen)
    src_table = torch.arange(S * MP, dtype=torch.int32).view(S, MP)
    idx_table = torch.arange(S * MP, dtype=torch.int32).view(S, MP)
    slot_of = torch.full((S * MP, BS), -1, dtype=torch.int32)
    ndev = S * hp + S * MP
    dev = torch.full((ndev, BS, W), float("nan"))
    hot_table = torch.arange(S * hp, dtype=torch.int32).view(S, hp)
    hot_pos = torch.full((S, B + 1), -1, dtype=torch.int32)
    lru = torch.arange(B, dtype=torch.int32).repeat(S, 1)
    res = None
    if adaptive:  # pages 0, 3, 5.. resident at their own device pages; others demoted
        res = torch.full((S, MP), -1, dtype=torch.int32)
        for r in range(S):
            for lp in range(MP):
                if lp % 3 == 0 or lp >= 6 or r == S - 1:
                    res[r, lp] = S * hp + r * MP + lp
                    dev[res[r, lp]] = src[src_table[r, lp]]
    t = dict(res_table=res, hot_table=hot_table, hot_pos=hot_pos, lru=lru, idx_table=idx_table,
             slot_of=slot_of, src_table=src_table, src=src, dev=dev)
    return {k: (v.to(device) if v is not None else None) for k, v in t.items()}


def write_newest(st, rows, pos, adaptive, fast=None):
    """What the policy does before resolving: the newest token's row lands in its slot (fast: short rows
    keep slot = position, as hisparse does)."""
    fast = not adaptive if fast is None else fast
    for r, P in zip(rows.tolist(), pos.tolist()):
        if r == S - 1:
            continue
        srow = st["src"].view(-1, W)[st["src_table"][r, P // BS] * BS + P % BS]
        if adaptive and st["res_table"][r, P // BS] >= 0:  # resident page: written in place
            st["dev"].view(-1, W)[st["res_table"][r, P // BS].long() * BS + P % BS] = srow
            continue
        s = P if P < B and fast else B
        hot = st["hot_table"][r].long()
        st["dev"].view(-1, W)[hot[s // BS] * BS + s % BS] = srow
        st["hot_pos"][r, s] = P
        if s < B:
            st["slot_of"][st["idx_table"][r, P // BS], P % BS] = P


def selection(gen, pos, rows):
    sel = torch.full((len(pos), K), -1, dtype=torch.int32)
    for n, P in enumerate(pos.tolist()):
        if rows[n] == S - 1:
            sel[n, 0] = 0
            continue
        k = min(K, P + 1)
        cand = torch.randperm(P + 1, generator=gen)[:k]
        if torch.rand(1, generator=gen) < 0.5:
            cand[0] = P  # the newest token selected
            cand = cand.unique(sorted=False)
        sel[n, : len(cand)] = cand.int()
    return sel


@pytest.mark.parametrize("adaptive,split,fast,stage", [(False, None, True, False), (True, None, False, False),
                                                      (False, 0, True, False), (True, 2, False, False),
                                                      (False, 3, True, False), (True, None, True, False),
                                                      (False, None, False, True), (True, 2, True, True),
                                                      (True, 3, False, True)])
def test_triton_matches_ref_over_steps(adaptive, split, fast, stage, device):
    """split: None = default second copy launch, 0 = copy inside the resolve program, 2 = two programs
    sharing 2-row chunks, 3 = one 2-row chunk per program (K = 5 rows at most) copied 4 columns at a time
    (a row of W = 6 in two column steps, the second partial). adaptive = resident pages; with fast, the
    short-row fast path too (hisparse verify windows: draft pages as resident ones). stage: misses copied
    host → staging rows beside the resolve (2-row staging chunks: 3 staging programs per request), then
    staging → hot rows, one scratch reused by every step (its counts must come back to zero each call)."""
    gen = torch.Generator().manual_seed(7 + adaptive)
    a, b = build(gen, device, adaptive), build(torch.Generator().manual_seed(7 + adaptive), device, adaptive)
    rows = torch.tensor([2, 0, 1, S - 1], dtype=torch.long, device=device)   # the last row is padding
    start = torch.tensor([1, 4, 9, 0])
    total_miss = 0
    scratch = ResolveScratch(len(rows), K, S, B, device) if stage else None
    for st in (a, b):  # prefill: every earlier position written once, in order
        for P in range(int(start.max())):
            live = [n for n in range(3) if P < start[n]]
            write_newest(st, rows.cpu()[live], torch.full((len(live),), P), adaptive, fast)
    for step in range(12):
        pos = (start + step).clamp(max=23)
        pos[-1] = 0
        pos = pos.to(device)
        sel = selection(gen, pos.cpu(), rows.cpu()).to(device)
        for st in (a, b):
            write_newest(st, rows.cpu(), pos.cpu(), adaptive, fast)
        ids_t, nm_t = kv_resolve_triton(sel, rows, pos, block_size=BS, fast_path=fast, split=split,
                                       copy_j=2 if split in (2, 3) else 16, block_w=4 if split == 3 else None,
                                       stage=stage, stage_j=2, scratch=scratch, **a)
        ids_r, nm_r = kv_resolve(sel, rows, pos, block_size=BS, fast_path=fast, backend="ref", **b)
        assert torch.equal(ids_t, ids_r), (step, ids_t, ids_r)
        assert torch.equal(nm_t, nm_r)
        for key in ("hot_pos", "lru", "slot_of"):
            assert torch.equal(a[key], b[key]), (step, key)
        assert torch.equal(a["dev"].nan_to_num(7.0), b["dev"].nan_to_num(7.0))
        total_miss += int(nm_t[:-1].sum())
        if stage:
            assert int(scratch.count.abs().sum()) == 0
        # every id holds the selected position's row; masked stay -1
        devf, srcf = a["dev"].view(-1, W), a["src"].view(-1, W)
        for n in range(3):
            r = int(rows[n])
            for j in range(K):
                p = int(sel[n, j])
                if p < 0:
                    assert ids_t[n, j] == -1
                    continue
                want = srcf[a["src_table"][r, p // BS] * BS + p % BS]
                assert torch.equal(devf[ids_t[n, j]], want), (step, n, j, p)
            lru_r = a["lru"][r]
            assert sorted(lru_r.tolist()) == list(range(B))  # still a permutation
    assert total_miss > 10  # evictions happened
    assert (a["slot_of"] >= 0).sum() <= 3 * B


def test_rejects_k_larger_than_buffer():
    st = build(torch.Generator().manual_seed(0), "cpu", False)
    sel = torch.zeros(1, B + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="hot buffer size"):
        kv_resolve(sel, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), block_size=BS,
                   fast_path=True, **st)


def test_stage_needs_the_second_launch(device):
    """The stage path's plan names staging rows, which only the second (device) copy launch reads."""
    st = build(torch.Generator().manual_seed(0), device, False)
    sel = torch.zeros(1, K, dtype=torch.int32, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="stage=True copies staging rows"):
        kv_resolve(sel, zero, zero, block_size=BS, fast_path=False, backend="triton",
                   config=dict(stage=True, split=0), **st)


def test_staging_rows_never_move_across_batch_buckets():
    """Each batch bucket's decode step is its own captured graph: the staging rows every default stage-path call
    uses (up to STAGE_MAX_ROWS request rows) must be one buffer from the first call on."""
    from synodic.kernels.kv_resolve.triton_impl import STAGE_MAX_ROWS
    k = 16
    scratch = ResolveScratch(STAGE_MAX_ROWS + 3, k, STAGE_MAX_ROWS + 4, 32, "cpu")
    first = scratch.staging(1 * k, 12, torch.bfloat16)
    for rows in range(2, STAGE_MAX_ROWS + 1):
        assert scratch.staging(rows * k, 12, torch.bfloat16).data_ptr() == first.data_ptr()
    assert scratch.staging((STAGE_MAX_ROWS + 2) * k, 12, torch.bfloat16).shape[0] >= (STAGE_MAX_ROWS + 2) * k


@pytest.mark.parametrize("backend", ["ref", "triton"])
def test_fast_path_resident_positions_past_the_hot_buffer(backend, device):
    """A hisparse verify window that starts below B takes the fast path for every query, and a later query
    selects window positions past the hot buffer's pages (kv.block_size=2, B=6, a 4-token window from position 5
    reaches position 8, page 4 of a 4-page hot table): they resolve to their draft (resident) pages and the hot
    table is never indexed with them (the reference raised IndexError, the kernel read past the table row)."""
    bs, b, hp = 2, 6, 4                        # hot table: ceil((B + 1) / bs) = 4 pages per slot
    W_, S_, MP = 3, 2, 8
    hot_table = torch.arange(S_ * hp, dtype=torch.int32).view(S_, hp)
    res = torch.full((S_, MP), -1, dtype=torch.int32)
    res[0, 2:5] = torch.tensor([20, 21, 22], dtype=torch.int32)   # draft pages of the window's pages 2..4
    dev = torch.randn(24, bs, W_)
    st = dict(res_table=res, hot_table=hot_table, hot_pos=torch.full((S_, b + 1), -1, dtype=torch.int32),
              lru=torch.arange(b, dtype=torch.int32).repeat(S_, 1), idx_table=torch.zeros(S_, MP, dtype=torch.int32),
              slot_of=torch.full((2, bs), -1, dtype=torch.int32), src_table=torch.zeros(S_, MP, dtype=torch.int32),
              src=torch.zeros(2, bs, W_), dev=dev)
    st = {k: v.to(device) for k, v in st.items()}
    sel = torch.tensor([[3, 8, 4, 6]], dtype=torch.int32, device=device)
    rows = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.full((1,), 5, dtype=torch.long, device=device)
    ids, nm = kv_resolve(sel, rows, pos, block_size=bs, fast_path=True, backend=backend, **st)
    # 3: hot slot 3 (hot page 1, offset 1); 8, 4, 6: draft pages 22, 20, 21 at offset 0
    assert ids.tolist() == [[3, 44, 40, 42]]
    assert int(nm.sum()) == 0
