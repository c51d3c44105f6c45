"""Host KV pool: the authoritative copy of every K/V row of the top-k policies.

Layer-first and paged: `data` is [layers, pages + 1, block_size, W] with one token's K and V of one
layer contiguous (W = 2 · nkv · hd values), so the rows a layer fetches together (positions of one
request, one layer) sit in a few contiguous pages. Sized by its own page count, independently of
device memory; pinned on a GPU run (read by the resolve kernel through unified addressing), plain
memory on a CPU run. Page tables live on the compute device (the resolve kernel reads them).

`buffer` (optional): a byte tensor the pool takes its rows from instead of allocating them, so a process that
rebuilds policies one after another (benchmarks: `rebuild_kv(..., host_buffer=)`) pins its host memory once.
Pinning tens of GB takes seconds per GB-range allocation, and two pools must never coexist in host RAM. Rows
of an earlier pool left in it are never used: a row reaches attention (miss, promotion, install) only after
this pool's prefill or backup wrote it, and the stale rows a window's first-page copy carries past the committed
length are overwritten by the window or never selected; the scratch page (padding rows) is zeroed.

Write-through backup: the new tokens' rows of every layer are copied device → host once per step, after
the last layer has placed its row (one launch per step, not one per layer). The copy reads its own
stacked copy of the rows, never the device slots, so slots can be rewritten at once. On a GPU it runs on
a side stream and records an event; the compute stream waits on that event before anything reads or
rewrites host rows or frees pages (`wait_all`: the next step's bind, demotion, promotion, prefill,
release); inside a CUDA-graph capture it joins the compute stream at once, so a captured step has no
dangling fork. On a CPU run the copy is synchronous.
"""
from __future__ import annotations

import torch

from synodic.kernels.row_copy import copy_rows

from .blocks import BlockManager


class HostKVPool:
    def __init__(self, num_layers: int, num_pages: int, block_size: int, row_width: int, dtype, max_slots: int,
                 max_blocks_per_seq: int, device, buffer: torch.Tensor | None = None):
        self.device = torch.device(device)
        self.bs = block_size
        self.W = row_width
        pin = self.device.type == "cuda"
        shape = (num_layers, num_pages + 1, block_size, row_width)
        if buffer is None:
            self.data = torch.zeros(*shape, dtype=dtype, pin_memory=pin)
        else:
            self.data = self._from_buffer(buffer, shape, dtype)
        self.blocks = BlockManager(num_pages, block_size, max_slots, max_blocks_per_seq, device)
        self.layer_rows = (num_pages + 1) * block_size   # flat rows of one layer
        self.pending = False
        if pin:
            self.stream = torch.cuda.Stream(device=self.device)
            self.event = torch.cuda.Event()

    @staticmethod
    def _from_buffer(buffer: torch.Tensor, shape: tuple, dtype) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        need = n * torch.empty(0, dtype=dtype).element_size()
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.device.type != "cpu":
            raise ValueError(f"host pool buffer: expected a 1-D uint8 CPU tensor, got {tuple(buffer.shape)} "
                             f"{buffer.dtype} on {buffer.device}")
        if buffer.numel() < need:
            raise ValueError(f"host pool buffer: {buffer.numel()} bytes for a pool of {need} bytes {shape}; expected "
                             f"a buffer of at least {need} bytes")
        data = buffer[:need].view(dtype).view(shape)
        data[:, -1].zero_()  # the scratch page
        return data

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
    def wait_all(self) -> None:
        """Compute stream waits for the pending backup (before host rows are read or rewritten, or pages
        freed). Inside a graph capture nothing is waited on: a captured step joined its backup already,
        and the runner joins the eager warm-ups' backups before it captures (waiting on an event recorded
        outside the capture would break capture isolation, as would waiting after it on one recorded inside)."""
        if not self.pending:
            return
        self.pending = False
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(self.device).wait_event(self.event)

    def backup(self, flat_rows: torch.Tensor, rows: torch.Tensor, src_rows: torch.Tensor) -> None:
        """host[flat_rows[m]] = rows[src_rows[m]]: flat rows over every layer (layer * layer_rows + row),
        rows [M, W] the step's stacked newest rows (write-through)."""
        dst = self.data.view(-1, self.W)
        if self.device.type != "cuda":
            copy_rows(dst, flat_rows, rows, src_rows)
            return
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            copy_rows(dst, flat_rows, rows, src_rows)
            self.event.record(self.stream)
        if torch.cuda.is_current_stream_capturing():
            cur.wait_event(self.event)               # no dangling fork in a captured step
            return
        for t in (flat_rows, rows, src_rows):        # the compute stream's allocator must not reuse them yet
            t.record_stream(self.stream)
        self.pending = True

    def write(self, i: int, host_rows: torch.Tensor, rows: torch.Tensor) -> None:
        """host[i][host_rows] = rows [M, W] (prefill; on the compute stream)."""
        src = rows.reshape(-1, self.W).contiguous()
        copy_rows(self.data[i].view(-1, self.W), host_rows, src,
                  torch.arange(src.shape[0], device=src.device))
