"""Host KV pool: the authoritative copy of every K/V row of the top-k policies.

Layer-first and paged: `data` is [layers, pages + 1, block_size, W] with one token's K and V of one
layer contiguous (W = 2 · nkv · hd values), so the rows a layer fetches together (positions of one
request, one layer) sit in a few contiguous pages. Sized by its own page count, independently of
device memory; pinned on a GPU run (read by the resolve kernel through unified addressing), plain
memory on a CPU run. Page tables live on the compute device (the resolve kernel reads them).

Write-through backup: every new token's row is copied device → host as soon as it is written. On a
GPU the copy runs on a side stream after the write, and records one event per layer; before the
device slot it came from is written again (the next step's newest token in the same layer) the
compute stream waits on that event, and the last layer's event joins the compute stream so a
captured step has no dangling fork. On a CPU run the copy is synchronous.
"""
from __future__ import annotations

import torch
from synodic.kernels.row_copy import copy_rows

from .blocks import BlockManager


class HostKVPool:
    def __init__(self, num_layers: int, num_pages: int, block_size: int, row_width: int, dtype, max_slots: int,
                 max_blocks_per_seq: int, device):
        self.device = torch.device(device)
        self.bs = block_size
        self.W = row_width
        pin = self.device.type == "cuda"
        self.data = torch.zeros(num_layers, num_pages + 1, block_size, row_width, dtype=dtype, pin_memory=pin)
        self.blocks = BlockManager(num_pages, block_size, max_slots, max_blocks_per_seq, device)
        self.num_layers = num_layers
        if pin:
            self.stream = torch.cuda.Stream(device=self.device)
            self.events = [torch.cuda.Event() for _ in range(num_layers)]
            self.pending = [False] * num_layers

    @property
    def table(self) -> torch.Tensor:
        return self.blocks.table

    def layer(self, i: int) -> torch.Tensor:
        """[pages + 1, bs, W] host rows of layer i."""
        return self.data[i]

    def rows(self, slots: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Flat host rows (page * bs + offset) of positions `pos` of `slots` (broadcasting)."""
        return self.table[slots, pos // self.bs].long() * self.bs + pos % self.bs

    def row_bytes(self) -> int:
        return self.W * self.data.element_size()

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    # -- writes -------------------------------------------------------------------------------
    def wait_backup(self, i: int) -> None:
        """Compute stream waits for layer i's last backup (call before reusing the slot it read).
        Inside a graph capture nothing is waited on: a captured step joins its own backups at its end,
        and the runner orders capture after the eager warm-up (waiting on an event recorded outside the
        capture would break capture isolation)."""
        if self.device.type != "cuda" or not self.pending[i]:
            return
        self.pending[i] = False
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(self.device).wait_event(self.events[i])

    def wait_all(self) -> None:
        """Compute stream waits for every pending backup (before pages are freed, reused or refilled
        between steps: demotion, promotion, prefill, release)."""
        for i in range(self.num_layers):
            self.wait_backup(i)

    def backup(self, i: int, dev_flat: torch.Tensor, dev_rows: torch.Tensor, host_rows: torch.Tensor,
               join: bool = False) -> None:
        """host[i][host_rows] = dev_flat[dev_rows] (write-through of the newest rows)."""
        dst = self.data[i].view(-1, self.W)
        if self.device.type != "cuda":
            copy_rows(dst, host_rows, dev_flat, dev_rows)
            return
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            copy_rows(dst, host_rows, dev_flat, dev_rows)
            self.events[i].record(self.stream)
        capturing = torch.cuda.is_current_stream_capturing()
        if not capturing:  # graph-pool memory outlives the graph anyway
            for t in (dev_rows, host_rows):
                t.record_stream(self.stream)
        self.pending[i] = not (capturing or join)
        if join:
            cur.wait_event(self.events[i])

    def write(self, i: int, host_rows: torch.Tensor, rows: torch.Tensor) -> None:
        """host[i][host_rows] = rows [M, W] (prefill; on the compute stream)."""
        src = rows.reshape(-1, self.W).contiguous()
        copy_rows(self.data[i].view(-1, self.W), host_rows, src,
                  torch.arange(src.shape[0], device=src.device))
