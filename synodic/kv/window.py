"""A verify window's retrieval for the hot-buffer policies (`kv=hisparse`, `kv=adaptive`): T = 1 + gamma queries per
(request, layer), resolved together against the device state at the start of the layer's window.

Per layer: every query's top-k is classified at once — resident (hisparse: the window's draft pages; adaptive:
resident pages, the window's tail pages among them), hot hit (the reverse map `slot_of`), or miss. Then

- shared retrieval (`kv.shared_retrieval=true`, the default): the misses of all T queries are deduplicated per
  request (their union) and each missed row is fetched host -> staging once for the whole window;
- per-query retrieval (`false`, for comparison): each query fetches its own misses into its own staging rows, so a
  row missed by several queries crosses the host link once per query.

Both modes give every query the same rows (outputs are identical); the ledger counts what was fetched and, beside
it, exactly what per-query retrieval fetches (the sum of the per-query miss counts), so the saving is measured
on the run itself. After the fetch the union's misses enter the hot buffer as a plain step's misses would: the
least recently used slots not hit by any query of the window take them (copied staging -> hot row on the device),
and every touched slot moves to the most recently used end. A union larger than the free slots keeps its excess
in staging for this step only.

Staging rows live after every layer's pages in the policy's one device pool tensor (`HotBufferPolicy._pool`), so
one buffer, allocated at build for the largest window, serves every layer and every verify step at a fixed
address (a captured step replays it). Everything here is fixed-shape tensor work with no host sync.
"""
from __future__ import annotations

import torch

from synodic.kernels.kv_resolve.fetch import fetch_rows
from synodic.kernels.row_copy import copy_rows


def staging_rows(max_slots: int, window: int, top_k: int) -> int:
    """Staging rows one layer's window needs: every (request, query, selected row) may miss."""
    return (max_slots + 1) * window * top_k if window > 1 else 0


def resolve_window(p, i: int, sel: torch.Tensor, res_table: torch.Tensor, fast: torch.Tensor | None,
                   shared: bool) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Layer i's T selections sel [N, T, K] (int32, -1 none) of the bound rows of policy `p` -> (ids per query,
    [N, K] int32 rows of p.window_dev(i), fetched rows per batch row [N], per-query-retrieval rows [N]).
    res_table: [S1, max_pages] resident pages (-1 not); fast: [N] bool rows whose non-resident positions sit in
    slot = position (hisparse short rows) or None."""
    N, T, K = sel.shape
    TK = T * K
    bs, W = p.bs, p.W
    dev_rows = p.rows
    r = dev_rows.long()[:, None, None]
    pv = sel.long()
    valid = pv >= 0
    pc = pv.clamp_min(0)
    lp, off = pc // bs, pc % bs
    page = res_table[r, lp].long()
    resident = valid & (page >= 0)
    rid = page * bs + off
    look = valid & ~resident
    if fast is not None:
        look = look & ~fast[:, None, None]
    sof = p.slot_of[i].view(-1)
    irow = p.idx_blocks.table[r, lp].long() * bs + off
    s = torch.where(look, sof[irow].long(), -1)
    hit = look & (s >= 0)
    miss = look & (s < 0)
    real = (dev_rows != p.S)
    per_query = (miss.sum((1, 2)) * real).long()

    # union of the window's misses per request: sorted, duplicates dropped (BIG = empty)
    BIG = torch.iinfo(torch.long).max
    sv, si = torch.where(miss, pv, BIG).view(N, TK).sort(dim=1, stable=True)
    dup = torch.zeros_like(sv, dtype=torch.bool)
    dup[:, 1:] = sv[:, 1:] == sv[:, :-1]
    u, order = torch.where(dup, BIG, sv).sort(dim=1, stable=True)
    first = si.gather(1, order)                                         # u[j]'s first (query, rank) entry
    in_u = u != BIG
    n_union = (in_u.sum(1) * real).long()

    base = (torch.arange(N, device=sel.device) * TK)[:, None]           # staging rows of batch row n
    host_of = lambda pos: p.host.rows(dev_rows[:, None], pos)           # noqa: E731 (flat host rows)
    stage = p.stage_flat()
    if shared:
        j = torch.searchsorted(u, pv.view(N, TK)).view(N, T, K).clamp_max(TK - 1)
        srow = base[:, :, None] + j
        fetch_rows(stage, (base + torch.arange(TK, device=sel.device)).flatten(),
                   p.host.layer(i).view(-1, W), torch.where(in_u, host_of(u.clamp(0, p.max_pages * bs - 1)),
                                                             -1).flatten())
        fetched = n_union
        u_stage = base + torch.arange(TK, device=sel.device)
    else:
        srow = base[:, :, None] + torch.arange(TK, device=sel.device).view(1, T, K)
        fetch_rows(stage, srow.flatten(), p.host.layer(i).view(-1, W),
                   torch.where(miss, host_of(pc.view(N, TK)).view(N, T, K), -1).flatten())
        fetched = per_query
        u_stage = base + first

    hot = p.hot_table[dev_rows.long()].long()                           # [N, hot pages]
    hp = hot.shape[1] * bs

    def hot_row(slot):
        slot = slot.clamp(0, hp - 1)
        return hot.gather(1, (slot // bs).view(N, -1)).view(slot.shape) * bs + slot % bs

    sbase = p.stage_base(i)
    ids = torch.where(resident, rid, torch.where(
        hit, hot_row(s), torch.where(miss, sbase + srow, torch.where(valid, hot_row(pc), -1))))
    _install(p, i, dev_rows, hit, s, u, in_u, hot_row, u_stage, stage)
    return [ids[:, t].int() for t in range(T)], fetched, per_query


def _install(p, i, rows, hit, s, u, in_u, hot_row, u_stage, stage) -> None:
    """The union's misses into the least recently used slots no window query hit; touched slots to the MRU end."""
    N = rows.shape[0]
    B, bs = p.B, p.bs
    dev = rows.device
    rl = rows.long()
    L = p.lru[i][rl].long()                                             # [N, B] least recent first
    mark = torch.zeros(N, B + 1, dtype=torch.bool, device=dev)
    mark.scatter_(1, torch.where(hit, s, B).view(N, -1), True)
    mark = mark[:, :B]
    nh = ~mark.gather(1, L)                                             # LRU entries no query hit
    crank = nh.long().cumsum(1) - 1
    vict = torch.full((N, B + 1), B, dtype=torch.long, device=dev)
    vict.scatter_(1, torch.where(nh, crank, B), L)
    n_free = nh.sum(1, keepdim=True)
    w = min(B, u.shape[1])
    uj, vj = u[:, :w], vict[:, :w]
    inst = in_u[:, :w] & (torch.arange(w, device=dev)[None] < n_free)
    sof = p.slot_of[i].view(-1)
    dummy_sof = sof.numel() - 1                                         # the scratch index page's last entry
    hp_flat = p.hot_pos[i].view(-1)
    dummy_hp = hp_flat.numel() - 1                                      # the scratch slot's newest-token slot
    # victims' old positions leave the reverse map
    old = p.hot_pos[i][rl].long().gather(1, vj.clamp_max(B - 1))
    ev = inst & (old >= 0)
    oc = old.clamp_min(0)
    # index_fill_, not `sof[idx] = -1`: a Python scalar there is a CPU tensor copied to the GPU, which a
    # CUDA graph capture refuses
    sof.index_fill_(0, torch.where(ev, p.idx_blocks.table[rl[:, None], oc // bs].long() * bs + oc % bs,
                                   dummy_sof).flatten(), -1)
    # the missed positions enter it, their rows staging -> hot row
    ucl = uj.clamp(0, p.max_pages * bs - 1)
    sof[torch.where(inst, p.idx_blocks.table[rl[:, None], ucl // bs].long() * bs + ucl % bs, dummy_sof)] = \
        torch.where(inst, vj, -1).int()
    hp_flat[torch.where(inst, rl[:, None] * (B + 1) + vj, dummy_hp)] = torch.where(inst, uj, -1).int()
    scratch_row = p.scratch_row()
    copy_rows(p.kv[i].view(-1, p.W), torch.where(inst, hot_row(vj), scratch_row).flatten(),
              stage, u_stage[:, :w].flatten())
    # recency: untouched slots keep their order, touched ones (hit or filled) move to the MRU end
    filled = torch.zeros(N, B + 1, dtype=torch.bool, device=dev)
    filled.scatter_(1, torch.where(inst, vj, B), True)
    touched = (mark | filled[:, :B]).gather(1, L)
    key = torch.arange(B, device=dev)[None] + B * touched.long()
    p.lru[i][rl] = L.gather(1, key.argsort(dim=1, stable=True)).int()
