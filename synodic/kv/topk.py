"""Shared machinery of the top-k KV policies (resident top-k, hisparse, adaptive).

Every policy keeps, per attention layer, a device pool of [pages + 1, block_size, W] rows (W = K|V of
one token, 2 · nkv · hd values; the +1 page is the scratch page of padding rows) and a resident
indexer key cache. One decode step of layer i:

    place the newest token's row (policy) → index its key → top-k positions (indexer)
      → physical row ids in top-k order (policy: page table / fused resolve) → sparse attention

Only placement differs between policies; the indexer, the selection and the attention math are the
same code on the same values in the same order, so the outputs are bitwise identical.

A decode step can be captured in a CUDA graph (`graph_safe`): the step reads fixed-address state and the
runner's fixed-address rows/positions, never syncs the host and has no data-dependent shapes; what
changes between steps on the host is done in `bind` (placement, promotion, the ledger's fetch flag), and
host state that picks the step's code path is part of `graph_key`. Padding rows of a bucket (the scratch
slot, position 0) map to scratch pages, take every resolve's no-lookup path and are not counted.

Prefill is sparse too (every prompt query attends to its own top-k of the prompt, DSA-style), so a
request recomputed after preemption attends to the same positions it saw while decoding (prefill runs
it as masked dense attention in the model dtype, so the values agree to that dtype's rounding).

The indexer is the training-free `KeyIndexer` (index key = the model's k, index query = the model's q)
or, when the model's attention layers carry a learned indexer and `kv.indexer` is auto / learned, a
`LearnedIndexer` (`learned_index` is True): the attention layer then passes `index=` (q_I, w, k_I of the
same tokens, synodic/models/indexer.py) to attend / attend_window / prefill_attend, and k_I is what the
index cache holds.
"""
from __future__ import annotations

import math
from collections import defaultdict, deque

import torch

from synodic.kernels.sparse_attention import sparse_attention

from .base import KVPolicy
from .indexer import KeyIndexer, LearnedIndexer, index_kind


class TopKPolicy(KVPolicy):
    uses_host = False
    graph_safe = True  # see the module docstring
    # overlapped steps: bind only stores the next step's rows; what the host plans from a step's results
    # (adaptive's demotion and promotion read the page stamps) waits for that step by reading the device,
    # and the ledger's fetch counters come back per step through `after_step` snapshots
    overlap_safe = True

    def __init__(self, model, max_slots: int, device, cfg, max_seq_len: int, index_pages: int):
        self.layers = model.attention_layers
        dims = {(m.nq, m.nkv, m.hd) for m in self.layers}
        if len(dims) != 1:
            raise ValueError(f"kv={cfg.kind}: expected one attention shape in every layer, got {sorted(dims)}")
        self.nq, self.nkv, self.hd = dims.pop()
        self.NL = len(self.layers)
        self.W = 2 * self.nkv * self.hd
        self.dtype = next(model.parameters()).dtype
        self.device = torch.device(device)
        self.S = max_slots                 # scratch slot id of padding rows
        self.bs = cfg.block_size
        self.top_k = cfg.top_k
        self.cfg = cfg
        self.max_pages = max(1, -(-max_seq_len // self.bs))
        kind = index_kind(cfg, model)
        self.learned_index = kind == "learned"
        if self.learned_index:
            ix = {(m.indexer.n_heads, m.indexer.head_dim) for m in self.layers}
            if len(ix) != 1:
                raise ValueError(f"kv={cfg.kind}: expected one learned-indexer shape in every layer, got {sorted(ix)}")
            (ih, idim), = ix
            self.indexer = LearnedIndexer(self.NL, index_pages, self.bs, ih, idim, cfg.learned_key_dtype, device)
        else:
            self.indexer = KeyIndexer(self.NL, index_pages, self.bs, self.nkv, self.hd, kind, device)
        self.rows = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = self.rows
        self.view_blocks = 1
        self._fetched = torch.zeros(self.NL, dtype=torch.long, device=device)  # host-fetched rows per layer, summed
        self._fetch_pending = False        # the bound step may fetch (else its snapshot is skipped: no read)
        self._fetch_snaps: deque = deque(maxlen=8)   # per queued step: ((copy of _fetched, event) or None, occupancy)
        self._fetched_seen = [0] * self.NL           # _fetched as of the last step the ledger accounted
        self._memo: dict = {}              # per-step index math, see bind
        self._misses: list[torch.Tensor] = []  # this step's per-layer miss counts so far (_count_misses)
        self._queries = 1                  # resolves per layer this step (window queries)
        self.stats: dict[str, int] = defaultdict(int)                           # cumulative, for reports
        self.stats_layers = {"selected": [0] * self.NL, "fetched": [0] * self.NL}

    # -- policy hooks ---------------------------------------------------------------------------
    def index_table(self) -> torch.Tensor:
        """[max_slots + 1, max_pages] index page of each logical page."""
        raise NotImplementedError

    def dev_kv(self, i: int) -> torch.Tensor:
        """[pages + 1, bs, W] device rows of layer i."""
        raise NotImplementedError

    def place_newest(self, i: int, kv: torch.Tensor, pos: torch.Tensor, t: int = 0) -> None:
        """Store rows kv [N, W] of positions pos [N] (= positions + t, window offset t) of the bound batch rows
        (device + host)."""
        raise NotImplementedError

    def resolve(self, i: int, sel: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Top-k positions [N, K] → physical row ids of dev_kv(i) [N, K] int32 (-1 masked)."""
        raise NotImplementedError

    def place_prefill(self, i: int, slot: int, kv: torch.Tensor, sel_last: torch.Tensor | None) -> None:
        """Store a prompt's rows kv [T, W] of `slot` (positions 0..T-1); sel_last: the last query's top-k."""
        raise NotImplementedError

    def device_bytes_held(self) -> int:
        raise NotImplementedError

    def may_fetch(self) -> bool:
        """Whether the bound step's resolve can copy rows from the host (decided at bind: a replayed
        graph runs no Python, so the ledger's fetch flag cannot be raised by the resolve itself)."""
        return False

    def graph_key(self) -> tuple:
        """Host state that picks the bound step's code path: the runner keeps one graph per value."""
        return ()

    # -- engine-facing --------------------------------------------------------------------------
    def bind(self, rows: torch.Tensor, positions: torch.Tensor, view_blocks: int) -> None:
        """Rows and positions of the next step. Page tables change only between steps (the engine grows,
        releases, demotes and promotes before bind), so index math that depends on rows, positions and tables
        alone is computed by the first layer of the step and reused by the others (`_per_step`)."""
        self.rows = rows
        self.positions = positions
        self.view_blocks = view_blocks
        self._memo = {}
        self._fetch_pending = self.may_fetch()

    def after_step(self) -> None:
        """The step just queued (decode or verify) is done with `_fetched`: queue a copy of the counters for the
        ledger, so that reading them later waits for this step only, not for a step queued after it (overlapped
        steps). Steps that cannot fetch queue nothing to copy."""
        fetch = None
        if self._fetch_pending:
            if self.device.type == "cuda":
                host = torch.empty(self.NL, dtype=torch.long, pin_memory=True)
                host.copy_(self._fetched, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
                fetch = (host, ev)
            else:
                fetch = (self._fetched.clone(), None)
        self._fetch_snaps.append((fetch, self.occupancy()))

    def _begin(self, i: int) -> None:
        """The first layer of a forward recomputes the per-step index math: a graph capture must record it
        (and the runner's warm-up forwards before it ran with every row as padding)."""
        if i == 0:
            self._memo = {}
            self._misses = []

    def _per_step(self, key, fn):
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = fn()
        return out

    def _pos(self, t: int = 0) -> torch.Tensor:
        """int64 positions of window offset t."""
        return self._per_step(("pos", t), lambda: self.positions.long() + t if t else self.positions.long())

    def _count_misses(self, i: int, n_miss: torch.Tensor) -> None:
        """Layer i's host-fetched rows per batch row ([N], from the resolve). The step's last resolve adds every
        layer's (padding rows excluded) to the device counter the ledger reads: a few launches a step, not three
        a layer. Resolves come in (layer, window query) order."""
        self._misses.append(n_miss)
        if len(self._misses) == self.NL * self._queries:
            real = self._per_step("real", lambda: (self.rows != self.S).int())
            per = torch.stack(self._misses).view(self.NL, self._queries, -1)
            self._fetched.add_((per * real).sum((1, 2)))
            self._misses = []

    def view_blocks_for(self, max_len: int) -> int:
        need = max(1, -(-max_len // self.bs))
        return min(self.max_pages, 1 << max(0, math.ceil(math.log2(need))))

    def is_sparse(self, i: int) -> bool:
        return True

    def _rows_of(self, table: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return table[slots, pos // self.bs].long() * self.bs + pos % self.bs

    def _paged_ids(self, table: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        """Top-k positions [N, K] (int32) of the bound rows → their rows in the pages `table` (int32) maps them
        to, -1 kept: row = p + (table[r, p // bs] - p // bs) · bs, the bracket computed once per step."""
        shift = self._per_step(("shift", id(table)), lambda: (table[self.rows] - torch.arange(
            table.shape[1], device=table.device, dtype=table.dtype)) * self.bs)
        return torch.where(sel >= 0, sel + shift.gather(1, (sel.clamp_min(0) // self.bs).long()), -1)

    def _kv_row(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([k, v], dim=-2).to(self.dtype).flatten(-2)

    def _attend_rows(self, i: int, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        dev = self.dev_kv(i).view(-1, 2, self.nkv, self.hd)
        # a row at position p selects min(top_k, p + 1) ranks and p < view_blocks * bs, so the columns past
        # the view are all masked: short contexts attend over the view, not over top_k columns (the width is
        # the view's power-of-two bucket, part of every graph key)
        return sparse_attention(q, dev[:, 0], dev[:, 1], ids[:, :min(ids.shape[1], self.view_blocks * self.bs)])

    def _index_qk(self, q: torch.Tensor, k: torch.Tensor, index) -> tuple[object, torch.Tensor]:
        """(index query, index key) of these tokens: (q, k) for the training-free indexer, ((q_I, w), k_I)
        from the attention layer's learned indexer (`index`, an IndexerOut) for the learned one."""
        if not self.learned_index:
            return q, k
        if index is None:
            raise ValueError(f"kv={self.cfg.kind} scores with the model's learned indexer: expected index= "
                             "(q_I, w, k_I) from the attention layer")
        return (index.q, index.w), index.k

    def _select(self, i: int, iq, pos: torch.Tensor, t: int = 0) -> torch.Tensor:
        """Layer i's top-k positions [N, top_k] int32 (-1 padded) of the queries at `pos` (window offset t)."""
        if self.selects_all():
            return self._per_step(("all", t), lambda: self._all_positions(pos))
        pages = self._per_step("pages", lambda: self.index_table()[self.rows, : self.view_blocks].long())
        return KeyIndexer.select(self.indexer.decode_scores(i, iq, pages), pos, self.top_k)

    def selects_all(self) -> bool:
        """Whether the bound step's top-k is every position its queries see: pos < view_blocks · bs <= top_k. The
        selection is then all of them (ascending), the same for every layer, so no layer scores or sorts (short
        contexts); view_blocks is part of every graph key."""
        return self.view_blocks * self.bs <= self.top_k

    def _all_positions(self, pos: torch.Tensor) -> torch.Tensor:
        j = torch.arange(self.top_k, dtype=torch.int32, device=pos.device)
        return torch.where(j <= pos[:, None], j, -1)

    def _step(self, i: int, q: torch.Tensor, iq, pos: torch.Tensor, t: int = 0) -> torch.Tensor:
        return self._attend_rows(i, q, self.resolve(i, self._select(i, iq, pos, t), pos))

    def _index_write(self, i: int, k: torch.Tensor, t: int = 0) -> None:
        """Index keys of the bound rows at positions + t."""
        def at():
            pos = self._pos(t)
            return self.index_table()[self.rows, pos // self.bs].long(), pos % self.bs
        self.indexer.write_at(i, *self._per_step(("index_at", t), at), k)

    def attend(self, i: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, index=None) -> torch.Tensor:
        """q [B, nq, hd], k_new/v_new [B, nkv, hd] of the token at self.positions → o [B, nq, hd];
        index: the learned indexer's (q_I [B, H_I, d_I], w [B, H_I], k_I [B, d_I]) when learned_index."""
        self._begin(i)
        self._queries = 1
        pos = self._pos()
        iq, ik = self._index_qk(q, k_new, index)
        self.place_newest(i, self._kv_row(k_new, v_new), pos)
        self._index_write(i, ik)
        return self._step(i, q, iq, pos)

    def _open_window(self, i: int, q, k_new, index, T: int) -> list:
        """A verify window's start in layer i (shared by every top-k policy's attend_window): checks, the step's
        per-layer setup, and each query's indexer scores / key (synodic.kv.indexer)."""
        self.check_window(T)
        self._begin(i)
        self._queries = T
        self.begin_window(i, T)
        return [self._index_qk(q[:, t], k_new[:, t], None if index is None else index.at(slice(None), t))
                for t in range(T)]

    def attend_window(self, i: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                      index=None) -> torch.Tensor:
        """Verify window: q [B, T, nq, hd], k/v [B, T, nkv, hd] at positions + 0..T-1 → o [B, T, nq, hd];
        query t selects over positions <= positions + t. Rejected rows are overwritten later.
        index: the learned indexer's outputs over [B, T] when learned_index."""
        B, T = q.shape[:2]
        if T == 1:
            return self.attend(i, q[:, 0], k_new[:, 0], v_new[:, 0],
                               index=None if index is None else index.at(slice(None), 0))[:, None]
        iqk = self._open_window(i, q, k_new, index, T)
        for t in range(T):
            self.place_newest(i, self._kv_row(k_new[:, t], v_new[:, t]), self._pos(t), t)
            self._index_write(i, iqk[t][1], t)
        return torch.stack([self._step(i, q[:, t], iqk[t][0], self._pos(t), t) for t in range(T)], 1)

    def check_window(self, T: int) -> None:
        pass

    def begin_window(self, i: int, T: int) -> None:
        """Layer i is about to place and attend a verify window of T tokens (after check_window)."""

    def write_prefill(self, i: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor,
                      sel_last: torch.Tensor | None = None, index_k: torch.Tensor | None = None) -> None:
        """Store a prompt's rows; index_k: the keys the index cache holds (the learned indexer's k_I
        [T, d_I]; default: k)."""
        if start != 0:
            raise NotImplementedError(f"kv={self.cfg.kind}: prefill from position {start}; expected whole-context "
                                      "prefill (start=0)")
        if self.learned_index and index_k is None:
            raise ValueError(f"kv={self.cfg.kind} scores with the model's learned indexer: expected index_k= (k_I)")
        self._memo = {}  # a prefill between bind and the step would change what the step computed
        T = k.shape[0]
        pos = torch.arange(T, device=k.device)
        self.indexer.write(i, self._rows_of(self.index_table(), torch.full_like(pos, slot), pos),
                           k if index_k is None else index_k)
        self.place_prefill(i, slot, self._kv_row(k, v), sel_last)

    def prefill_attend(self, i: int, slot: int, start: int, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, index=None) -> torch.Tensor:
        """Sparse prefill: q [T, nq, hd], k/v [T, nkv, hd] → o [T, nq, hd]; stores the prompt's rows.
        index: the learned indexer's (q_I [T, H_I, d_I], w [T, H_I], k_I [T, d_I]) when learned_index.

        Every query attends exactly to its selected positions (softmax over those only), computed as dense
        attention under a boolean mask of the selection, chunked over queries: re-gathering top_k rows per
        query (the decode kernel's shape) moves top_k · row bytes per query, ~29 GB per layer at 12K
        tokens. Queries before position top_k select their whole causal prefix, so their mask is causal
        and their selection is never computed (save the last query's, kept in top-k order for the policy)."""
        iq, ik = self._index_qk(q, k, index)
        T = q.shape[0]
        lo = min(self.top_k, T - 1)                     # first query whose selection is computed
        sel = self.indexer.prefill_select(iq, ik, self.top_k, start=lo)       # rows of queries lo..T-1
        self.write_prefill(i, slot, start, k, v, sel[-1], index_k=ik)
        return self._masked_prefill(q, k, v, sel, lo)

    PREFILL_SCORE_BYTES = 1 << 30                       # fp32 scores of one query chunk, all heads

    def _masked_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sel: torch.Tensor,
                        lo: int) -> torch.Tensor:
        """o [T, nq, hd]: query p attends to keys {t <= p} when p < lo, else to the positions of sel[p - lo]
        (-1 = none); SDPA in the model dtype, keys shared by each group of nq / nkv heads."""
        import torch.nn.functional as F
        T, nq, hd = q.shape
        dev = q.device
        qh = q.to(self.dtype).transpose(0, 1)[None]              # [1, nq, T, hd]
        kh, vh = (x.to(self.dtype).transpose(0, 1)[None] for x in (k, v))   # [1, nkv, T, hd]
        if self.nkv == 1:    # broadcast the one KV head: a stride-0 view, no copy
            kh, vh = kh.expand(1, nq, T, hd), vh.expand(1, nq, T, hd)
        elif self.nkv != nq:
            kh, vh = kh.repeat_interleave(nq // self.nkv, 1), vh.repeat_interleave(nq // self.nkv, 1)
        chunk = max(1, min(T, self.PREFILL_SCORE_BYTES // (4 * nq * T)))
        out = torch.empty(T, nq, hd, dtype=self.dtype, device=dev)
        t = torch.arange(T, device=dev)
        for c in range(0, T, chunk):
            e = min(T, c + chunk)                               # keys < e are all this chunk can see
            mask = t[None, :e] <= t[c:e, None]                  # causal
            if e > lo:  # queries with a computed selection: exactly their selected keys
                a = max(c, lo)
                s = sel[a - lo:e - lo].long()
                m = torch.zeros(e - a, e + 1, dtype=torch.bool, device=dev)
                m.scatter_(1, torch.where(s >= 0, s, e), True)  # -1 → the dropped column e
                mask[a - c:] = m[:, :e]
            o = F.scaled_dot_product_attention(qh[:, :, c:e], kh[:, :, :e], vh[:, :, :e], attn_mask=mask[None, None])
            out[c:e] = o[0].transpose(0, 1)
        return out.to(q.dtype)

    # -- ledger -------------------------------------------------------------------------------
    def row_bytes(self) -> int:
        """Bytes of one token's K and V in one layer."""
        return self.W * torch.empty(0, dtype=self.dtype).element_size()

    def extra_bytes(self, lengths: list[int]) -> dict[str, int]:
        """Policy-specific traffic of the steps since the last ledger read ("_h2d_extra" adds to kv_h2d_bytes)."""
        return {}

    def occupancy(self) -> dict[str, float]:
        """What the policy holds now (taken as each step is queued, so an overlapped step's ledger entry reports
        the memory of its own step, not of the one queued after it)."""
        held = self.device_bytes_held()
        return {"kv_device_bytes": held, "kv_device_bytes_per_request": held // max(1, self.running_requests())}

    def bytes_for(self, lengths: list[int]) -> dict[str, int]:
        """What the last decode step moved for rows of these context lengths (new token included).

        kv_device_read: selected rows (K and V, every layer) + the indexer keys scored (kv_index_read);
        kv_host_fetch / kv_host_fetched_rows: rows copied host → device because a selected row missed;
        kv_h2d_bytes: all host → device traffic (misses, promotions, host-sourced installs);
        kv_d2h_bytes: the write-through backup; kv_device_bytes(_per_request): device KV held (pages and
        hot buffers, indexer keys); kv_running: requests in the step; per layer: fetched rows, miss rate.
        Host-fetch counters: the oldest step's `after_step` snapshot (steps are accounted in launch order), or,
        for a caller that ran the layers itself, the device counters now."""
        sel = sum(min(self.top_k, n) for n in lengths)
        if self._fetch_snaps:
            snap, occ = self._fetch_snaps.popleft()
        else:
            snap, occ = ((self._fetched, None) if self._fetch_pending else None), self.occupancy()
        if snap is None:
            fetched = [0] * self.NL
        else:
            if snap[1] is not None:
                snap[1].synchronize()
            total = snap[0].tolist()
            fetched = [t - s for t, s in zip(total, self._fetched_seen)]
            self._fetched_seen = total
        rb = self.row_bytes()
        index_read = sum(lengths) * self.NL * self.indexer.row_bytes()
        out = {"kv_device_read": sel * self.NL * rb + index_read, "kv_host_fetch": sum(fetched) * rb,
               "kv_selected_rows": sel * self.NL, "kv_host_fetched_rows": sum(fetched),
               "kv_index_read": index_read,
               "kv_h2d_bytes": sum(fetched) * rb,
               "kv_d2h_bytes": len(lengths) * self.NL * rb if self.uses_host else 0,
               **occ, "kv_running": len(lengths)}
        for i, f in enumerate(fetched):
            out[f"kv_fetched_rows_layer{i}"] = f
            out[f"kv_miss_rate_layer{i}"] = f / sel if sel else 0.0
            self.stats_layers["selected"][i] += sel
            self.stats_layers["fetched"][i] += f
        extra, win = self.extra_bytes(lengths), self.window_bytes()
        out["kv_h2d_bytes"] += extra.pop("_h2d_extra", 0) + win.pop("_h2d_extra", 0)
        out.update(extra)
        out.update(win)
        self.stats["steps"] += 1
        self.stats["selected_rows"] += sel * self.NL
        self.stats["fetched_rows"] += sum(fetched)
        self.stats["max_running"] = max(self.stats["max_running"], len(lengths))
        return out

    def running_requests(self) -> int:
        return 1

    def window_bytes(self) -> dict[str, int]:
        """A verify window's retrieval counters (the hot-buffer policies'); none for a resident pool."""
        return {}


class ResidentTopKPolicy(TopKPolicy):
    """`kv=resident` with top_k > 0: the paged device pool of the baseline, attention over the top-k rows.
    The indexer keys share the KV pages (one table)."""

    def __init__(self, model, max_slots: int, device, cfg, max_seq_len: int):
        super().__init__(model, max_slots, device, cfg, max_seq_len, cfg.num_blocks)
        from .blocks import BlockManager
        self.blocks = BlockManager(cfg.num_blocks, self.bs, max_slots, self.max_pages, device)
        self.kv = [torch.zeros(cfg.num_blocks + 1, self.bs, self.W, dtype=self.dtype, device=device)
                   for _ in range(self.NL)]

    def index_table(self):
        return self.blocks.table

    def dev_kv(self, i):
        return self.kv[i]

    def place_newest(self, i, kv, pos, t=0):
        dst = self._per_step(("dst", t), lambda: self._rows_of(self.blocks.table, self.rows, pos))
        self.kv[i].view(-1, self.W)[dst] = kv

    def resolve(self, i, sel, pos):
        return self._paged_ids(self.blocks.table, sel)

    def place_prefill(self, i, slot, kv, sel_last):
        pos = torch.arange(kv.shape[0], device=kv.device)
        self.kv[i].view(-1, self.W)[self._rows_of(self.blocks.table, torch.full_like(pos, slot), pos)] = kv

    def device_bytes_held(self) -> int:
        page = self.bs * self.NL * (self.row_bytes() + self.indexer.row_bytes())
        return self.blocks.used() * page

    def running_requests(self) -> int:
        return max(1, len(self.blocks.owned))
