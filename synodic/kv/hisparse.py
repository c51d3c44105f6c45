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
"""
from __future__ import annotations

import torch

from .blocks import BlockManager
from .hot import HotBufferPolicy


class HiSparseBlocks:
    """Scheduler-facing accounting of hisparse: device pages = hot buffers; index and host pages checked too."""

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
    def __init__(self, model, max_slots, device, cfg, max_seq_len):
        super().__init__(model, max_slots, device, cfg, max_seq_len)
        self.dev_blocks = BlockManager(cfg.num_blocks, self.bs, max_slots, self.HP, device)
        self.hot_table = self.dev_blocks.table
        self.blocks = HiSparseBlocks(self)

    def may_fetch(self) -> bool:
        return True

    def check_window(self, T: int) -> None:
        raise NotImplementedError("kv=hisparse: speculative verify windows need a draft zone in the hot buffer "
                                  "(not built yet); use kv=adaptive or kv=resident with top_k")

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

    def place_prefill(self, i, slot, kv, sel_last):
        self.quiesce_host()
        T = kv.shape[0]
        pos = torch.arange(T, device=kv.device)
        rs = torch.full_like(pos, slot)
        self.host.write(i, self.host.rows(rs, pos), kv)
        if T <= self.B:  # short: slot = position
            self.kv[i].view(-1, self.W)[self._rows_of(self.hot_table, rs, pos)] = kv
            self.hot_pos[i, slot, :T] = pos.int()
            self.slot_of[i].view(-1)[self._rows_of(self.idx_blocks.table, rs, pos)] = pos.int()
        else:
            self.preload(i, slot, kv, pos, sel_last)

    def device_bytes_held(self) -> int:
        return (self.dev_blocks.used() * self.bs * self.NL * self.row_bytes()
                + self.idx_blocks.used() * self.bs * self.NL * self.indexer.row_bytes())

    def running_requests(self) -> int:
        return max(1, len(self.dev_blocks.owned))

    def extra_bytes(self, lengths):
        return {"kv_host_bytes": self.host_bytes_held()}
