"""`kv=hisparse`: the full KV lives in the host pool; the device keeps, per (request, layer), a hot
buffer of B slots under LRU plus one reserved slot for the newest token.

Decode, per layer: the newest row goes to its slot (slot `pos` while pos < B, else the reserved
slot B) and is written through to the host; the indexer picks the top-k; one fused `kv_resolve`
maps them to device rows (fast path while pos < B: slot = position, no lookups; else hits, LRU
victims for misses, recency rewrite and the host → device copy of the missed rows). The fast path is
taken per row inside the kernel, so one captured graph serves short and long rows alike (padding rows,
at position 0, always take it and touch no hot-buffer state).

Device footprint per request: its hot buffer pages (ceil(min(tokens, B+1) / bs), so short requests
hold little) plus its indexer key pages; the host pool holds every row. Admission spends all three.

Speculative verify windows (`kv.draft_pages` > 0): each request slot owns draft pages after the pool
(fixed device memory, counted in `device_bytes_held`, outside what admission spends). A
window step maps the window's tail pages (the page of its first position and the next ones) to them in a
per-step page table, copies that first page's committed rows from the host, and writes the window rows there
only (and to the host, as every row): never into the hot buffer, its LRU or the reverse map. The window's
queries take the draft table as resident pages and resolve together (synodic/kv/window.py: shared retrieval).
The fast path is chosen by the window's first position: a row that starts its window below B finds every
earlier position in slot = position and every window position in the draft pages, so it needs no lookups and
evicts nothing, even for queries past B. `commit` then puts the accepted rows below B into slot = position (where
a plain step keeps them); rejected rows are dropped with the draft pages (the host copies past the committed
length are rewritten before any query can select them).
"""
from __future__ import annotations

import torch

from synodic.kernels.row_copy import copy_rows

from .blocks import BlockManager
from .hot import HotBufferPolicy


class HiSparseBlocks:
    """Scheduler-facing accounting of hisparse: device pages = hot buffers; index and host pages checked too."""
    evicts = False

    def __init__(self, policy: "HiSparsePolicy"):
        self.p = policy
        self.dev, self.idx, self.host = policy.dev_blocks, policy.idx_blocks, policy.host.blocks
        self.num_blocks = self.dev.num_blocks
        self.max_blocks_per_seq = self.dev.max_blocks_per_seq
        self.owned = self.dev.owned

    def _dev_tokens(self, tokens: int) -> int:
        return min(tokens, self.p.B + 1)

    def blocks_for(self, tokens: int) -> int:
        """Device pages a request of this length holds (more than the pool when host or index pages,
        or the sequence limit, can never hold it)."""
        for pool in (self.idx, self.host):
            if pool.blocks_for(tokens) > min(pool.num_blocks, pool.max_blocks_per_seq):
                return self.num_blocks + 1
        return self.dev.blocks_for(self._dev_tokens(tokens))

    def can_grow(self, slot: int, tokens: int) -> bool:
        return (self.dev.can_grow(slot, self._dev_tokens(tokens)) and self.idx.can_grow(slot, tokens)
                and self.host.can_grow(slot, tokens))

    def grow(self, slot: int, tokens: int) -> None:
        self.dev.grow(slot, self._dev_tokens(tokens))
        self.idx.grow(slot, tokens)
        self.host.grow(slot, tokens)

    def release(self, slot: int) -> None:
        self.p.quiesce_host()
        self.p.reset_hot(slot)
        for pool in (self.dev, self.idx, self.host):
            pool.release(slot)

    def used(self) -> int:
        return self.dev.used()


class HiSparsePolicy(HotBufferPolicy):
    def __init__(self, model, max_slots, device, cfg, max_seq_len, window: int = 1, host_buffer=None):
        super().__init__(model, max_slots, device, cfg, max_seq_len, window, host_buffer)
        self.dev_blocks = BlockManager(cfg.num_blocks, self.bs, max_slots, self.HP, device)
        self.hot_table = self.dev_blocks.table
        self.blocks = HiSparseBlocks(self)
        self.DP = cfg.draft_pages
        self.draft_base = cfg.num_blocks + 1   # slot r's draft pages: draft_base + r * DP + 0..DP-1
        self._win = 1                           # tokens per row of the current step's window
        self._committable = None                # (rows, first positions, draft table, T) of the last window step

    def _extra_pages(self, cfg, S1: int) -> int:
        return S1 * cfg.draft_pages

    def may_fetch(self) -> bool:
        return True

    def bind(self, rows, positions, view_blocks):
        self._win = 1
        super().bind(rows, positions, view_blocks)

    def check_window(self, T: int) -> None:
        need = self.cfg.window_pages(T)
        if need > self.DP:
            raise ValueError(f"kv=hisparse: a verify window of {T} tokens spans {need} pages; expected "
                             f"kv.draft_pages >= {need}, got {self.DP}")

    def begin_window(self, i, T):
        """Layer i of a window step: the committed rows of each row's first window page, host → draft page."""
        self._win = T
        _, dst, src = self._draft()
        copy_rows(self.kv[i].view(-1, self.W), dst, self.host.layer(i).view(-1, self.W), src)
        self._win_rows[2] += (self.rows != self.S).sum() * self.bs  # real rows only (padding rows copy scratch)

    def _draft(self):
        """(page table [S1, max_pages] mapping each bound row's window pages to its draft pages, else -1;
        device rows and host rows of the first window page), the same in every layer of the step."""
        def plan():
            lp0 = self._pos() // self.bs
            d = torch.arange(self.DP, device=self.device)
            lp = lp0[:, None] + d
            pages = self.draft_base + self.rows.long()[:, None] * self.DP + d
            ok = lp < self.max_pages
            # fixed shapes (a mask index would sync the host inside a capture): pages past max_pages write the
            # flat table's one spare entry, dropped by the view
            n = (self.S + 1) * self.max_pages
            flat = torch.full((n + 1,), -1, dtype=torch.int32, device=self.device)
            flat[torch.where(ok, self.rows.long()[:, None] * self.max_pages + lp, n)] = torch.where(ok, pages, -1).int()
            table = flat[:n].view(self.S + 1, self.max_pages)
            off = torch.arange(self.bs, device=self.device)
            dst = (pages[:, :1] * self.bs + off).flatten()
            src = self.host.rows(self.rows[:, None], lp0[:, None] * self.bs + off).flatten()
            return table, dst, src
        return self._per_step(("draft", self._win), plan)

    def _newest_at(self, pos):
        """Where the newest rows go, the same in every layer: (device row, flat hot_pos entry, position as
        int32, reverse-map row, its value)."""
        short = pos < self.B
        s = torch.where(short, pos, self.B)
        return (self._rows_of(self.hot_table, self.rows, s), self.rows * (self.B + 1) + s, pos.int(),
                self._rows_of(self.idx_blocks.table, self.rows, pos), torch.where(short, pos, -1).int())

    def place_newest(self, i, kv, pos, t=0):
        dst, hot, p32, irow, slot = self._per_step(("newest", t), lambda: self._newest_at(pos))
        self.kv[i].view(-1, self.W)[dst] = kv
        self.hot_pos[i].view(-1)[hot] = p32
        self.slot_of[i].view(-1)[irow] = slot
        self._backup(i, kv, t)

    def resolve(self, i, sel, pos):
        ids, n_miss = self._resolve(i, sel, self.rows, pos, None, True)
        self._count_misses(i, n_miss)
        return ids

    # -- verify windows -------------------------------------------------------------------------
    def window_table(self):
        return self._draft()[0]

    def window_fast(self):
        return self._per_step("win_fast", lambda: self._pos() < self.B)

    def place_window(self, i, kv, t):
        """Window row t: its draft page and the host only."""
        self.kv[i].view(-1, self.W)[self._per_step(("draft_row", t), lambda: self._rows_of(
            self._draft()[0], self.rows, self._pos(t)))] = kv
        self._backup(i, kv, t)
        if i == 0 and t == 0:
            self._committable = (self.rows, self._pos(), self._draft()[0], self._win)

    def commit(self, accepted):
        """Accepted window rows below B: draft page -> hot slot = position (the short-row layout every later fast
        path reads), with hot_pos and the reverse map; rows at or past B stay on the host only, as after a plain
        step. Every layer; fixed shapes, no host sync."""
        if self._committable is None:
            return
        rows, p0, table, T = self._committable
        self._committable = None
        t = torch.arange(T, device=self.device)
        pos = p0[:, None] + t                                              # [N, T]
        ok = (t[None] < accepted.to(self.device)[:, None]) & (pos < self.B) & (rows != self.S)[:, None]
        r = rows.long()[:, None].expand_as(pos)
        pc = torch.where(ok, pos, 0)
        src = self._rows_of(table, r, torch.where(ok, pos, p0[:, None]))
        dst = torch.where(ok, self._rows_of(self.hot_table, r, pc), self.scratch_row())
        hp = torch.where(ok, r * (self.B + 1) + pc, self.hot_pos[0].numel() - 1)
        irow = torch.where(ok, self._rows_of(self.idx_blocks.table, r, pc), self.slot_of[0].numel() - 1)
        val = torch.where(ok, pos, -1).int()
        for i in range(self.NL):
            flat = self.kv[i].view(-1, self.W)
            copy_rows(flat, dst.flatten(), flat, src.flatten())
            self.hot_pos[i].view(-1)[hp.flatten()] = val.flatten()
            self.slot_of[i].view(-1)[irow.flatten()] = val.flatten()

    def place_prefill(self, i, slot, kv, sel_last):
        pos, rs = self.prefill_to_host(i, slot, kv)
        T = kv.shape[0]
        if T <= self.B:  # short: slot = position
            self.kv[i].view(-1, self.W)[self._rows_of(self.hot_table, rs, pos)] = kv
            self.hot_pos[i, slot, :T] = pos.int()
            self.slot_of[i].view(-1)[self._rows_of(self.idx_blocks.table, rs, pos)] = pos.int()
        else:
            self.preload(i, slot, kv, pos, sel_last)

    def device_bytes_held(self) -> int:
        """Hot-buffer and index pages in use, plus the draft pages (allocated for every slot up front) and the window
        staging rows (one buffer for every layer)."""
        pages = self.dev_blocks.used() + (self.S + 1) * self.DP
        return (pages * self.bs * self.NL * self.row_bytes() + self.stage_pages * self.bs * self.row_bytes()
                + self.idx_blocks.used() * self.bs * self.NL * self.indexer.row_bytes())

    def running_requests(self) -> int:
        return max(1, len(self.dev_blocks.owned))

    def draft_copy_bytes(self, nbytes):
        return {"_h2d_extra": nbytes, "kv_draft_copy_bytes": nbytes}

    def occupancy(self):
        return {**super().occupancy(), "kv_host_bytes": self.host_bytes_held()}
