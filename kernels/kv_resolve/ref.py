"""Torch reference of `kv_resolve` (one layer, one call per decode step). Same state machine as the
Triton kernel, entry for entry: tests require the two to agree exactly (ids, every state tensor and
every copied row)."""
from __future__ import annotations

import torch


def _hot_rows(hot: torch.Tensor, bs: int):
    """Hot slot → device row for one request: hot_table row `hot`, pages of `bs` slots."""
    return lambda s: hot[s // bs] * bs + s % bs


def kv_resolve_ref(sel, rows, pos, res_table, hot_table, hot_pos, lru, idx_table, slot_of, src_table, src,
                   dev, block_size: int, fast_path: bool, ids=None, n_miss=None):
    N, K = sel.shape
    B = lru.shape[1]
    bs = block_size
    W = dev.shape[-1]
    devf, srcf, sof = dev.view(-1, W), src.view(-1, W), slot_of.view(-1)
    if ids is None:
        ids = torch.empty(N, K, dtype=torch.int32, device=sel.device)
    if n_miss is None:
        n_miss = torch.empty(N, dtype=torch.int32, device=sel.device)
    for n in range(N):
        r, P = int(rows[n]), int(pos[n])
        p = sel[n].long()
        valid = p >= 0
        pc = p.clamp_min(0)
        hot = hot_table[r].long()
        hot_row = _hot_rows(hot, bs)

        if res_table is not None:
            page = res_table[r, pc // bs].long()
            resident = valid & (page >= 0)
            rid = page * bs + pc % bs
        else:
            resident = torch.zeros_like(valid)
            rid = torch.zeros_like(p)
        if fast_path and P < B:  # short sequence: hot slot j holds position j, no lookups
            # a resident position (a window's draft page) may lie past the hot buffer: never index hot_table with it
            ids[n] = torch.where(resident, rid, torch.where(valid, hot_row(torch.where(resident, 0, pc)), -1)
                                 ).to(ids.dtype)
            n_miss[n] = 0
            continue
        newest = valid & ~resident & (p == P)
        look = valid & ~resident & ~newest
        irow = idx_table[r, pc // bs].long() * bs + pc % bs
        s = torch.where(look, sof[irow].long(), -1)
        hit = look & (s >= 0)
        miss = look & (s < 0)
        L = lru[r].long()
        mark = torch.zeros(B, dtype=torch.bool, device=sel.device)
        mark[s[hit]] = True
        nh = ~mark[L]
        crank = torch.cumsum(nh.long(), 0) - 1
        m = int(miss.sum())
        victim = nh & (crank < m)
        vict = L[victim]                                   # the m least recently used unhit slots
        mrank = torch.cumsum(miss.long(), 0) - 1
        v = torch.where(miss, vict[mrank.clamp(0, max(m - 1, 0))] if m else s, -1)
        vm = v[miss]
        # evict the victims' old positions from the reverse map, install the missed ones
        q = hot_pos[r, vm].long()
        qv = q >= 0
        if qv.any():
            qc = q[qv]
            sof[idx_table[r, qc // bs].long() * bs + qc % bs] = -1
        pm = p[miss]
        sof[irow[miss]] = vm.to(sof.dtype)
        hot_pos[r, vm] = pm.to(hot_pos.dtype)
        if m:
            src_rows = src_table[r, pm // bs].long() * bs + pm % bs
            devf[hot_row(vm)] = srcf[src_rows.to(srcf.device)].to(devf.device)
        slot = torch.where(hit, s, v)
        out = torch.where(resident, rid, torch.where(newest, hot_row(torch.full_like(p, B)),
                                                     torch.where(look, hot_row(slot.clamp_min(0)), -1)))
        ids[n] = out.to(ids.dtype)
        kept = nh & ~victim
        lru[r] = torch.cat([L[kept], slot[hit | miss]]).to(lru.dtype)
        n_miss[n] = m
    return ids, n_miss
