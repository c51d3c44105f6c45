"""`kv=adaptive`: residency follows load.

While the device pool has room every request keeps all its pages resident and reads no host rows.
Every row is written through to the host pool as it is produced (prefill rows directly, decode rows
by the write-through backup), so a completed page is already on the host and demoting it is free.

Under pressure (a request must grow or be admitted and free pages are short) pages are demoted one
request at a time, coldest first (the step a row of the page was last selected; pages holding the
current top-k are the hottest), never a request's `tail_pages` newest pages. A request's first
demotion gives it a hot buffer (B slots per layer); the rows of the current top-k that sat on the
demoted pages are installed into it straight from the device pages before they are freed, so the
protected working set — tail pages, newest token, current selection — never leaves the device.
A request is only demoted if that frees more than its hot buffer costs. A new request that cannot be
admitted fully resident even after demotions is admitted in hot-buffer mode (tail + hot buffer).

The resolve is three-way: resident page → hot row → host (miss: LRU victim, copied from the host).

Promotion (chosen policy): before a step, while at least `promote_free_fraction` of the pool would
stay free, up to `promote_pages_per_step` demoted pages are copied back host → device — the request
with the fewest demoted pages first, its hottest pages first; a request with no demoted page left
gives its hot buffer back. Demotion needs pressure and promotion needs slack, so the two never
undo each other within a step.
"""
from __future__ import annotations

import math

import torch

from synodic.kernels.row_copy import copy_rows

from .hot import HotBufferPolicy


class AdaptiveBlocks:
    """Scheduler-facing accounting of adaptive: device pages (resident pages + hot buffers), counting
    what demotion can free; index and host pages checked too."""

    def __init__(self, policy: "AdaptivePolicy"):
        self.p = policy
        self.num_blocks = policy.P
        self.max_blocks_per_seq = policy.max_pages

    @property
    def owned(self):
        return self.p.pages

    def blocks_for(self, tokens: int) -> int:
        """Device pages a request of this length needs at least (hot-buffer mode when that is smaller);
        more than the pool when host or index pages, or the sequence limit, can never hold it."""
        p = self.p
        for pool in (p.idx_blocks, p.host.blocks):
            if pool.blocks_for(tokens) > min(pool.num_blocks, pool.max_blocks_per_seq):
                return self.num_blocks + 1
        return p.min_pages(-(-tokens // p.bs))

    evicts = True  # growth may demote other requests' pages (see Engine._chain_rows)

    def can_grow(self, slot: int, tokens: int) -> bool:
        return self.p.can_grow(slot, tokens)

    def fits_free(self, slot: int, tokens: int) -> bool:
        """Growing slot to `tokens` needs no demotion (only pages already free)."""
        p = self.p
        n = -(-tokens // p.bs)
        need = p.min_pages(n) if slot not in p.pages else n - len(p.pages[slot])
        return need <= len(p.free)

    def grow(self, slot: int, tokens: int) -> None:
        self.p.grow(slot, tokens)

    def release(self, slot: int) -> None:
        self.p.release(slot)

    def used(self) -> int:
        return self.p.P - len(self.p.free) - self.p.reserved_pages


class AdaptivePolicy(HotBufferPolicy):
    def __init__(self, model, max_slots, device, cfg, max_seq_len, window: int = 1, host_buffer=None):
        super().__init__(model, max_slots, device, cfg, max_seq_len, window, host_buffer)
        P, S1 = cfg.num_blocks, max_slots + 1
        self.P = P
        self.tail = cfg.tail_pages
        # the newest token always sits in a resident tail page: hot buffers need B slots, no reserved slot
        self.HPA = -(-self.B // self.bs)
        self.free: list[int] = list(range(P - 1, -1, -1))
        # logical page → device page (-1: demoted; P: the scratch page, for padding rows and unused entries)
        self.res_table = torch.full((S1, self.max_pages), P, dtype=torch.int32, device=device)
        self.hot_table = torch.full((S1, self.HP), P, dtype=torch.int32, device=device)
        self.page_stamp = torch.zeros(S1, self.max_pages + 1, dtype=torch.long, device=device)
        self.last_sel = torch.full((self.NL, S1, self.top_k), -1, dtype=torch.int32, device=device)
        self.step = 0
        self.step_t = torch.zeros((), dtype=torch.long, device=device)
        self._sels: list[tuple[int, torch.Tensor]] = []  # (layer, selection) of this step, recorded at its end
        self._win_sels: list[tuple[int, torch.Tensor]] = []  # (layer, [N, T, K]) of a verify step, until commit
        self.pages: dict[int, list[int]] = {}   # slot → device page per logical page (-1 demoted)
        self.nres: dict[int, int] = {}          # slot → resident logical pages
        self.hot: dict[int, list[int]] = {}     # slot → hot-buffer pages (hot-buffer mode)
        self._moved = {"promoted_pages": 0, "demoted_pages": 0, "install_rows_device": 0, "install_rows_host": 0}
        self.blocks = AdaptiveBlocks(self)
        self.reserved_pages = 0   # pool pages withheld for other device memory (reserve_device_bytes)
        self.reserved_bytes = 0

    # -- accounting ---------------------------------------------------------------------------
    def reserve_device_bytes(self, nbytes: int, what: str) -> None:
        """Withhold the device pages `nbytes` of other device memory fill (the drafter's context ring) from the
        pool for good: admission, demotion and promotion then plan with what is left. Before any request."""
        from synodic.config.errors import ConfigError
        page = self.bs * self.NL * self.row_bytes()
        n = -(-nbytes // page)
        if n >= len(self.free) or self.pages:
            raise ConfigError([f"kv.num_blocks={self.P} with {what} of {nbytes} bytes ({n} pages of {page} bytes): "
                               f"expected kv.num_blocks > {n + self.P - len(self.free)}"])
        for _ in range(n):
            self.free.pop(0)  # the highest page ids (the pool hands out the lowest first)
        self.reserved_pages += n
        self.reserved_bytes += nbytes
        self.blocks.num_blocks -= n

    def min_pages(self, n_pages: int) -> int:
        """Fewest device pages a request of n_pages logical pages can live in."""
        return min(n_pages, min(self.tail, n_pages) + self.HPA)

    def _demotable(self, slot: int) -> int:
        return self.nres[slot] - min(self.tail, len(self.pages[slot]))

    def _reclaimable(self) -> int:
        return sum(self._demotable(s) if s in self.hot else max(0, self._demotable(s) - self.HPA) for s in self.pages)

    def can_grow(self, slot: int, tokens: int) -> bool:
        if not (self.idx_blocks.can_grow(slot, tokens) and self.host.blocks.can_grow(slot, tokens)):
            return False
        n = -(-tokens // self.bs)
        if n > self.max_pages:
            return False
        have = len(self.pages.get(slot, []))
        need = self.min_pages(n) if slot not in self.pages else n - have
        # free pages first: the scheduler asks for every running request every step, and the reclaimable
        # count is a scan over all requests (O(requests^2) a step at batch 256 was ~15 ms of host time)
        return need <= len(self.free) or need <= len(self.free) + self._reclaimable()

    def grow(self, slot: int, tokens: int) -> None:
        self.idx_blocks.grow(slot, tokens)
        self.host.blocks.grow(slot, tokens)
        n = -(-tokens // self.bs)
        if slot not in self.pages:
            self._flush_stamps()
            self.pages[slot], self.nres[slot] = [], 0
            self.page_stamp[slot] = self.step
            if len(self.free) + self._reclaimable() >= n:
                self._make_room(n)
            else:  # born in hot-buffer mode: tail pages resident, the rest on the host only
                tail = min(self.tail, n)
                self._make_room(tail + self.HPA)
                self._enter_hot(slot)
                self.pages[slot] = [-1] * (n - tail)
                self.res_table[slot, : n - tail] = -1
        add = n - len(self.pages[slot])
        if add <= 0:
            return
        self._make_room(add)
        new = [self.free.pop() for _ in range(add)]
        start = len(self.pages[slot])
        self.pages[slot].extend(new)
        self.nres[slot] += add
        self.res_table[slot, start:start + add] = torch.tensor(new, dtype=torch.int32)

    def release(self, slot: int) -> None:
        self.quiesce_host()
        self._flush_stamps()
        if slot in self.hot:
            self._leave_hot(slot)
        self.free.extend(p for p in reversed(self.pages.pop(slot, [])) if p >= 0)
        self.nres.pop(slot, None)
        self.res_table[slot] = self.P
        self.page_stamp[slot] = 0
        self.last_sel[:, slot] = -1
        self.idx_blocks.release(slot)
        self.host.blocks.release(slot)

    # -- demotion -----------------------------------------------------------------------------
    def _make_room(self, need: int) -> None:
        """Demote until `need` pages are free: the request holding the coldest demotable page goes
        first, losing its pages no hotter than the next candidate's coldest (at least one; a request's
        first demotion takes enough pages to pay for its hot buffer)."""
        if len(self.free) >= need:
            return
        self._flush_stamps()
        stamps = self.page_stamp.tolist()  # one device read; the candidate scan below is plain Python
        while len(self.free) < need:
            cands = []
            for s in self.pages:
                d = self._demotable(s)
                if d <= 0 or (s not in self.hot and d <= self.HPA):
                    continue
                n = len(self.pages[s])
                st = stamps[s]
                lps = [lp for lp in range(n - min(self.tail, n)) if self.pages[s][lp] >= 0]
                lps.sort(key=lambda lp: (st[lp], lp))
                cands.append(((st[lps[0]], s not in self.hot, -d), s, lps))
            if not cands:
                raise RuntimeError("kv=adaptive: out of device pages although can_grow allowed the request")
            cands.sort(key=lambda c: c[0])
            _, s, lps = cands[0]
            short = need - len(self.free)
            if s in self.hot:
                limit = cands[1][0][0] if len(cands) > 1 else None
                count = 1
                while count < min(len(lps), short) and (limit is None or stamps[s][lps[count]] <= limit):
                    count += 1
            else:
                count = min(len(lps), self.HPA + max(1, short))
            self._demote(s, lps[:count])

    def _enter_hot(self, slot: int) -> None:
        pages = [self.free.pop() for _ in range(self.HPA)]
        self.hot[slot] = pages
        self.hot_table[slot, : self.HPA] = torch.tensor(pages, dtype=torch.int32)
        self.reset_hot(slot)

    def _leave_hot(self, slot: int) -> None:
        self.reset_hot(slot)
        self.free.extend(reversed(self.hot.pop(slot)))
        self.hot_table[slot] = self.P

    def _demote(self, slot: int, lps: list[int]) -> None:
        self.quiesce_host()
        early = slot not in self.hot and len(self.free) >= self.HPA
        if early:
            self._enter_hot(slot)
        src_table = self.res_table.clone()           # the demoted pages, still holding their rows
        idx = torch.tensor(lps, device=self.device)
        self.res_table[slot, idx] = -1
        for lp in lps:
            self.free.append(self.pages[slot][lp])
            self.pages[slot][lp] = -1
        self.nres[slot] -= len(lps)
        self._moved["demoted_pages"] += len(lps)
        if early or slot in self.hot:  # install the current top-k rows of the demoted pages, device → device
            self._install(slot, src_table, self.kv, "install_rows_device")
        else:                          # freed pages may now be the hot buffer: install from the host
            self._enter_hot(slot)
            self._install(slot, self.host.table, [self.host.layer(i) for i in range(self.NL)], "install_rows_host")

    def _install(self, slot: int, src_table, src, counter: str) -> None:
        rows = torch.full((1,), slot, dtype=torch.long, device=self.device)
        pos = torch.full((1,), -1, dtype=torch.long, device=self.device)
        n = [self._resolve(i, self.last_sel[i, slot][None], rows, pos, self.res_table, False, src_table=src_table,
                           src=src[i])[1] for i in range(self.NL)]
        self._moved[counter] += int(torch.cat(n).sum())  # one device read for every layer

    # -- promotion ----------------------------------------------------------------------------
    def _promote(self) -> None:
        budget = self.cfg.promote_pages_per_step
        floor = math.ceil(self.cfg.promote_free_fraction * (self.P - self.reserved_pages))
        self._flush_stamps()
        while budget > 0 and self.hot:
            slot = min(self.hot, key=lambda s: (len(self.pages[s]) - self.nres[s], s))
            demoted = [lp for lp, p in enumerate(self.pages[slot]) if p < 0]
            if demoted and len(self.free) - 1 < floor:
                return
            self.quiesce_host()
            stamps = self.page_stamp[slot].tolist()
            demoted.sort(key=lambda lp: (-stamps[lp], lp))
            take = []
            for lp in demoted[:budget]:
                if len(self.free) - 1 < floor:
                    break
                take.append((lp, self.free.pop()))
            if take:
                lp_t = torch.tensor([lp for lp, _ in take], device=self.device)
                pg_t = torch.tensor([pg for _, pg in take], device=self.device)
                off = torch.arange(self.bs, device=self.device)
                dst = (pg_t[:, None] * self.bs + off).flatten()
                src = self.host.rows(torch.full_like(lp_t, slot)[:, None], lp_t[:, None] * self.bs + off).flatten()
                for i in range(self.NL):
                    copy_rows(self.kv[i].view(-1, self.W), dst, self.host.layer(i).view(-1, self.W), src)
                self.res_table[slot, lp_t] = pg_t.int()
                for lp, pg in take:
                    self.pages[slot][lp] = pg
                self.nres[slot] += len(take)
                self._moved["promoted_pages"] += len(take)
                budget -= len(take)
            if self.nres[slot] == len(self.pages[slot]):
                self._leave_hot(slot)
            elif len(take) < len(demoted):
                return

    def check_window(self, T: int) -> None:
        if self.cfg.window_pages(T) > self.tail:
            raise ValueError(f"kv=adaptive: a verify window of {T} tokens spans more than tail_pages={self.tail} pages")

    # -- step ---------------------------------------------------------------------------------
    def bind(self, rows, positions, view_blocks):
        self._flush_stamps()
        self.step += 1
        self.step_t.fill_(self.step)
        self._promote()  # first: it may end hot-buffer mode, which may_fetch / graph_key read
        super().bind(rows, positions, view_blocks)

    def may_fetch(self) -> bool:
        return bool(self.hot)

    def graph_key(self) -> tuple:
        # no request in hot-buffer mode: the resolve is the plain page lookup (see resolve)
        return (bool(self.hot),)

    def place_newest(self, i, kv, pos, t=0):
        dst = self._per_step(("newest", t), lambda: self._rows_of(self.res_table, self.rows, pos))  # a tail page
        self.kv[i].view(-1, self.W)[dst] = kv
        self._backup(i, kv, t)

    def resolve(self, i, sel, pos):
        if not self.hot:
            # no request in hot-buffer mode, so every page of every request is resident: the three-way resolve
            # is the page lookup (the kernel would touch no hot-buffer state and fetch nothing); skip its launches.
            # A host branch, so part of graph_key: a graph captured either way is replayed only that way.
            ids = self._paged_ids(self.res_table, sel)
        else:
            ids, n_miss = self._resolve(i, sel, self.rows, pos, self.res_table, False)
            self._count_misses(i, n_miss)
        self._sels.append((i, sel))
        if i == self.NL - 1:  # within the forward, so a captured step records (and a replay redoes) the stamps
            self._flush_stamps()
        return ids

    # -- verify windows: the window's queries stamp pages only once their tokens are accepted ----------------
    def window_table(self):
        return self.res_table

    def place_window(self, i, kv, t):
        self.place_newest(i, kv, self._pos(t), t)  # a resident tail page (check_window), and the host

    def window_ids(self, i, sel):
        if not self.hot:  # every page resident: the page lookup, as a plain step (see resolve)
            ids = [self._paged_ids(self.res_table, sel[:, t]) for t in range(sel.shape[1])]
        else:
            ids = super().window_ids(i, sel)
        self._win_sels.append((i, sel))
        return ids

    def commit(self, accepted):
        """The queries of accepted tokens (t < accepted[n]) are the ones plain decoding would have run: only they
        stamp pages, and the last of them is the row's current selection (what a demotion installs)."""
        self._flush_window(accepted.to(self.device))

    def _flush_window(self, accepted) -> None:
        if not self._win_sels:
            return
        sels, self._win_sels = dict(self._win_sels), []
        sel = torch.stack([sels[i] for i in range(self.NL)]) if len(sels) == self.NL else None
        if sel is None:  # an aborted forward: nothing of it is committed
            return
        T = sel.shape[2]
        t = torch.arange(T, device=self.device)
        acc = accepted.clamp(1, T)
        kept = torch.where((t[None, :] < acc[:, None])[None, :, :, None], sel, -1)          # [NL, N, T, K]
        last = sel.gather(2, (acc - 1).view(1, -1, 1, 1).expand(self.NL, -1, 1, sel.shape[3])).squeeze(2)
        # a window may leave some of its misses in staging only (more than the hot buffer's free slots), and a
        # demotion installs the current selection from the device: keep the positions that are on the device
        pc = last.long().clamp_min(0)
        r = self.rows.long()[None, :, None]
        lp, off = pc // self.bs, pc % self.bs
        irow = self.idx_blocks.table[r, lp].long() * self.bs + off
        hot = self.slot_of.view(self.NL, -1).gather(1, irow.view(self.NL, -1)).view_as(irow) >= 0
        on_dev = (self.res_table[r, lp] >= 0) | hot
        self.last_sel[:, self.rows] = torch.where(on_dev, last, -1)
        col = torch.where(kept >= 0, kept.long() // self.bs, self.max_pages)
        col = col.permute(1, 0, 2, 3).reshape(col.shape[1], -1)
        self.page_stamp[self.rows[:, None], col] = self.step_t

    def _flush_stamps(self) -> None:
        """Record this step's selections: each layer's last one in last_sel, and the step in the stamp of
        every page any of them (every layer) touched — a few scatters per step instead of some per layer.
        Called after the last layer and before anything reads or rewrites stamps or last_sel (demotion,
        promotion, admission, release, the next bind). A verify step's selections wait for `commit`; one never
        committed counts its first query (the anchor's, always kept)."""
        if self._win_sels:
            self._flush_window(torch.ones(self.rows.shape[0], dtype=torch.long, device=self.device))
        if not self._sels:
            return
        sels, self._sels = self._sels, []
        latest = dict(sels)
        if len(latest) == self.NL:
            self.last_sel[:, self.rows] = torch.stack([latest[i] for i in range(self.NL)])
        else:
            for i, sel in latest.items():
                self.last_sel[i][self.rows] = sel
        sel = torch.cat([s for _, s in sels], 1) if len(sels) > 1 else sels[0][1]
        col = torch.where(sel >= 0, sel.long() // self.bs, self.max_pages)
        self.page_stamp[self.rows[:, None], col] = self.step_t

    def place_prefill(self, i, slot, kv, sel_last):
        pos, _ = self.prefill_to_host(i, slot, kv)
        page = self.res_table[slot, pos // self.bs].long()
        res = page >= 0
        self.kv[i].view(-1, self.W)[(page * self.bs + pos % self.bs)[res]] = kv[res]
        if sel_last is not None:
            self.last_sel[i, slot] = sel_last
        if slot in self.hot:
            self.preload(i, slot, kv, pos[~res], sel_last)

    # -- ledger -------------------------------------------------------------------------------
    def device_bytes_held(self) -> int:
        """Pages in use, hot buffers and index pages, the window staging rows, and the withheld pages' owner (the
        drafter's ring, counted at its own size, not its pages')."""
        return ((self.P - len(self.free) - self.reserved_pages) * self.bs * self.NL * self.row_bytes()
                + self.reserved_bytes + self.stage_pages * self.bs * self.row_bytes()
                + self.idx_blocks.used() * self.bs * self.NL * self.indexer.row_bytes())

    def running_requests(self) -> int:
        return max(1, len(self.pages))

    def extra_bytes(self, lengths):
        moved = dict(self._moved)
        for k in self._moved:
            self._moved[k] = 0
            self.stats[k] += moved[k]
        rb = self.row_bytes()
        promote_b = moved["promoted_pages"] * self.bs * self.NL * rb
        return {"_h2d_extra": promote_b + moved["install_rows_host"] * rb, "kv_promote_bytes": promote_b,
                **{f"kv_{k}": v for k, v in moved.items()}}

    def occupancy(self):
        total = sum(len(p) for p in self.pages.values())
        return {**super().occupancy(), "kv_resident_page_fraction": sum(self.nres.values()) / total if total else 1.0,
                "kv_hot_mode_requests": len(self.hot), "kv_host_bytes": self.host_bytes_held()}
