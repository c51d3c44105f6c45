"""Hot-buffer state shared by `kv=hisparse` and `kv=adaptive`: per (layer, request) B slots plus one
reserved newest-token slot, the LRU order, and the per-token reverse map, all on the device.

- `hot_pos[i, r, s]`: position held by hot slot s (-1 empty); slot B is the newest-token slot.
- `lru[i, r]`: the B slots, least recently used first.
- `slot_of[i]`: [index pages + 1, bs] hot slot of each token (-1: not in the buffer), paged with the
  indexer keys, so a lookup is one load (a collision-free hash of the position).
Invariant: slot_of[p] = s  ⇔  hot_pos[s] = p, for s < B; free index pages hold -1 throughout.
"""
from __future__ import annotations

from collections import deque

import torch

from synodic.kernels.kv_resolve import kv_resolve

from .host_pool import HostKVPool
from .topk import TopKPolicy
from .window import resolve_window, staging_rows


class HotBufferPolicy(TopKPolicy):
    uses_host = True

    def __init__(self, model, max_slots, device, cfg, max_seq_len, window: int = 1, host_buffer=None):
        super().__init__(model, max_slots, device, cfg, max_seq_len, cfg.index_num_blocks)
        from .blocks import BlockManager
        self.B = cfg.B
        if self.top_k > self.B:
            raise ValueError(f"kv={cfg.kind}: top_k={self.top_k} > hot_buffer={self.B}; expected hot_buffer >= top_k")
        self.HP = -(-(self.B + 1) // self.bs)          # pages of one hot buffer (B slots + newest slot)
        S1 = max_slots + 1
        self.idx_blocks = BlockManager(cfg.index_num_blocks, self.bs, max_slots, self.max_pages, device)
        self.host = HostKVPool(self.NL, cfg.host_num_blocks, self.bs, self.W, self.dtype, max_slots,
                               self.max_pages, device, buffer=host_buffer)
        # every layer's pages, then a verify window's staging rows (synodic/kv/window.py), in one tensor: layer i's
        # window attention reads its pages and the staging rows through one view, and the staging rows are one
        # fixed buffer for every layer and every verify step
        self.window = window
        self.shared_retrieval = cfg.shared_retrieval
        self.P1 = cfg.num_blocks + 1 + self._extra_pages(cfg, S1)
        self.stage_pages = -(-staging_rows(max_slots, window, self.top_k) // self.bs)
        self._pool = torch.zeros(self.NL * self.P1 + self.stage_pages, self.bs, self.W, dtype=self.dtype,
                                 device=device)
        self.kv = [self._pool[i * self.P1:(i + 1) * self.P1] for i in range(self.NL)]
        # window rows: per-query, fetched, host rows copied into draft pages (kv=hisparse); device counters, so
        # a replayed graph of a speculative step is counted like an eager one
        self._win_rows = torch.zeros(3, dtype=torch.long, device=device)
        self._win_seen = [0, 0, 0]
        self._win_snaps: deque = deque(maxlen=8)  # per queued step: (copy of _win_rows, event or None)
        self.hot_pos = torch.full((self.NL, S1, self.B + 1), -1, dtype=torch.int32, device=device)
        self.lru = torch.arange(self.B, dtype=torch.int32, device=device).repeat(self.NL, S1, 1)
        self.slot_of = torch.full((self.NL, cfg.index_num_blocks + 1, self.bs), -1, dtype=torch.int32, device=device)
        self._backup_q: list[tuple[int, int, torch.Tensor]] = []   # (layer, window offset, rows) of this step
        self.scratch = None
        if self.device.type == "cuda":
            from synodic.kernels.kv_resolve.triton_impl import ResolveScratch
            self.scratch = ResolveScratch(S1, self.top_k, S1, self.B, device)
        self.hot_table: torch.Tensor  # [S1, >= HP] device pages of each request's hot buffer

    def _extra_pages(self, cfg, S1: int) -> int:
        """Device pages after the pool (and its scratch page) that the policy keeps for itself."""
        return 0

    def index_table(self):
        return self.idx_blocks.table

    # -- write-through backup: queued per layer, copied once per step -------------------------------
    def bind(self, rows, positions, view_blocks):
        self.quiesce_host()   # last step's rows reach the host before this step's misses read it
        super().bind(rows, positions, view_blocks)

    def prefill_to_host(self, i: int, slot: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt's K/V rows [T, W] of layer i into the host pool (every row lives there); returns their positions
        and the slot per row, for the policy's device placement."""
        self.quiesce_host()
        pos = torch.arange(kv.shape[0], device=kv.device)
        rs = torch.full_like(pos, slot)
        self.host.write(i, self.host.rows(rs, pos), kv)
        return pos, rs

    def quiesce_host(self) -> None:
        """Backups queued and finished (compute stream ordered after them): before host rows are read or
        rewritten, or pages freed."""
        self._flush_backup()
        self.host.wait_all()

    def _backup(self, i: int, kv: torch.Tensor, t: int = 0) -> None:
        """Queue layer i's newest rows kv [N, W] (bound rows at positions + t) for this step's backup. kv is
        the rows' own tensor, which nothing rewrites, so the device slot may be reused before the copy."""
        self._backup_q.append((i, t, kv))

    def _host_rows(self, t: int = 0) -> torch.Tensor:
        return self._per_step(("host_rows", t), lambda: self.host.rows(self.rows, self._pos(t)))

    def _step(self, i, q, iq, pos):
        if i == self.NL - 1:  # every layer has placed its rows (inside the forward: a captured step records the copy)
            self._flush_backup()
        return super()._step(i, q, iq, pos)

    def _flush_backup(self) -> None:
        """One host copy of every queued row: entries in (layer, offset) order, as attend / attend_window
        queue them over a whole step; a partial step (an aborted forward) is copied entry by entry."""
        q, self._backup_q = self._backup_q, []
        if not q:
            return
        T = 1 + max(t for _, t, _ in q)
        L = self.host.layer_rows
        if len(q) == self.NL * T and all((i, t) == divmod(j, T) for j, (i, t, _) in enumerate(q)):
            flat = self._per_step(("backup_rows", T), lambda: (
                torch.arange(self.NL, device=self.device)[:, None, None] * L
                + torch.stack([self._host_rows(t) for t in range(T)])[None]).flatten())
        else:
            flat = torch.cat([self._host_rows(t) + i * L for i, t, _ in q])
        rows = torch.cat([kv for _, _, kv in q])
        self.host.backup(flat, rows, self._per_step(("backup_src", rows.shape[0]),
                                                    lambda: torch.arange(rows.shape[0], device=self.device)))

    def dev_kv(self, i):
        return self._pool[i * self.P1:] if self._queries > 1 else self.kv[i]

    # -- verify windows (synodic/kv/window.py) ------------------------------------------------------------
    def stage_flat(self) -> torch.Tensor:
        """[staging rows, W]: the window staging rows every layer shares."""
        return self._pool[self.NL * self.P1:].view(-1, self.W)

    def stage_base(self, i: int) -> int:
        """Row of the first staging row in layer i's window view (dev_kv(i) during a window)."""
        return (self.NL - i) * self.P1 * self.bs

    def scratch_row(self) -> int:
        """A row of the scratch page (padding rows' page): writes nobody reads."""
        return self.cfg.num_blocks * self.bs

    def window_table(self) -> torch.Tensor:
        """[S1, max_pages] pages a window's queries find resident (the policy's)."""
        raise NotImplementedError

    def window_fast(self) -> torch.Tensor | None:
        """[N] rows whose non-resident positions sit at slot = position (hisparse short rows), or None."""
        return None

    def place_window(self, i: int, kv: torch.Tensor, t: int) -> None:
        """Window row t of layer i: in reserved rows only (never the hot buffer, its LRU or the reverse map)."""
        raise NotImplementedError

    def attend_window(self, i, q, k_new, v_new, index=None):
        """A verify window (see synodic/kv/window.py): the T queries' selections resolved together, their misses
        fetched once per window (shared retrieval) or once per query; window rows kept out of the hot buffer."""
        B, T = q.shape[:2]
        if T == 1:
            return super().attend_window(i, q, k_new, v_new, index)
        if T > self.window:
            raise ValueError(f"kv={self.cfg.kind}: a verify window of {T} tokens; the policy was built for windows "
                             f"of at most {self.window} (BuildContext.window)")
        iqk = self._open_window(i, q, k_new, index, T)
        for t in range(T):
            self.place_window(i, self._kv_row(k_new[:, t], v_new[:, t]), t)
            self._index_write(i, iqk[t][1], t)
        if i == self.NL - 1:  # every layer has placed its rows: one backup copy for the step
            self._flush_backup()
        sel = torch.stack([self._select(i, iqk[t][0], self._pos(t), t) for t in range(T)], 1)
        ids = self.window_ids(i, sel)
        return torch.stack([self._attend_rows(i, q[:, t], ids[t]) for t in range(T)], 1)

    def window_ids(self, i: int, sel: torch.Tensor) -> list[torch.Tensor]:
        ids, fetched, per_query = resolve_window(self, i, sel, self.window_table(), self.window_fast(),
                                                 self.shared_retrieval)
        self._fetched[i] += fetched.sum()
        self._win_rows[:2] += torch.stack([per_query.sum(), fetched.sum()])
        return ids

    def after_step(self) -> None:
        """Also snapshot the window counters behind every step (device ops only, so a replayed graph of a
        speculative step is accounted like an eager one); none for a policy built without windows."""
        super().after_step()
        if self.window <= 1:
            return
        if self.device.type == "cuda":
            host = torch.empty(3, dtype=torch.long, pin_memory=True)
            host.copy_(self._win_rows, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._win_snaps.append((host, ev))
        else:
            self._win_snaps.append((self._win_rows.clone(), None))

    def commit(self, accepted: torch.Tensor) -> None:
        """After a verify: keep accepted[n] (1..T) window rows of batch row n; the rest are dropped by length."""

    def window_bytes(self) -> dict[str, int]:
        """The oldest accounted step's window retrieval: fetched bytes and, exactly beside them, what per-query
        retrieval fetches (zero for a step that was no window)."""
        if not self._win_snaps:
            return {}
        snap, ev = self._win_snaps.popleft()
        if ev is not None:
            ev.synchronize()
        now = snap.tolist()
        per_query, fetched, draft = (a - b for a, b in zip(now, self._win_seen))
        self._win_seen = now
        rb = self.row_bytes()
        self.stats["window_fetched_rows"] += fetched
        self.stats["window_per_query_rows"] += per_query
        return {"kv_window_fetch_bytes": fetched * rb, "kv_window_per_query_fetch_bytes": per_query * rb,
                "kv_window_shared_saved_bytes": (per_query - fetched) * rb,
                "kv_window_shared_retrieval": int(self.shared_retrieval), **self.draft_copy_bytes(draft * rb)}

    def draft_copy_bytes(self, nbytes: int) -> dict[str, int]:
        """Ledger keys of the host → draft-page copies (a policy with draft pages); "_h2d_extra" adds to
        kv_h2d_bytes."""
        return {}

    def _resolve(self, i, sel, rows, pos, res_table, fast_path, src_table=None, src=None):
        ids, n_miss = kv_resolve(
            sel, rows, pos, res_table=res_table, hot_table=self.hot_table, hot_pos=self.hot_pos[i], lru=self.lru[i],
            idx_table=self.idx_blocks.table, slot_of=self.slot_of[i],
            src_table=self.host.table if src_table is None else src_table,
            src=self.host.layer(i) if src is None else src, dev=self.kv[i], block_size=self.bs,
            fast_path=fast_path, scratch=self.scratch)
        return ids, n_miss

    def reset_hot(self, slot: int) -> None:
        """Empty slot's hot buffers (every layer) and clear its reverse-map entries."""
        self.hot_pos[:, slot] = -1
        self.lru[:, slot] = torch.arange(self.B, dtype=torch.int32, device=self.device)
        pages = self.idx_blocks.owned.get(slot, [])
        if pages:
            self.slot_of[:, torch.tensor(pages, device=self.device)] = -1

    def preload(self, i: int, slot: int, kv: torch.Tensor, cand: torch.Tensor, sel_last: torch.Tensor | None) -> None:
        """Fill slot's empty hot buffer of layer i from prompt rows kv [T, W]: the last prompt query's
        selection (most recent use) plus the newest other candidate positions, up to B. cand: positions
        allowed (ascending)."""
        B = self.B
        sel = sel_last[sel_last >= 0].long() if sel_last is not None else cand[:0]
        allowed = torch.zeros(kv.shape[0], dtype=torch.bool, device=kv.device)
        allowed[cand] = True
        sel = sel[allowed[sel]]
        keep = allowed.clone()
        keep[sel] = False
        rest = torch.nonzero(keep).flatten()
        rest = rest[max(0, rest.numel() - (B - sel.numel())):]
        pre = torch.cat([rest, sel.flip(0)])           # least → most recently used
        n = pre.numel()
        if n == 0:
            return
        s = torch.arange(n, device=kv.device)
        rs = torch.full_like(s, slot)
        self.kv[i].view(-1, self.W)[self._rows_of(self.hot_table, rs, s)] = kv[pre]
        self.hot_pos[i, slot, :n] = pre.int()
        self.slot_of[i].view(-1)[self._rows_of(self.idx_blocks.table, rs, pre)] = s.int()
        self.lru[i, slot] = torch.cat([torch.arange(n, B, device=kv.device), s]).int()

    def host_bytes_held(self) -> int:
        return self.host.blocks.used() * self.bs * self.NL * self.row_bytes()
