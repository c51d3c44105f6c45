"""`kv=resident`: every past K/V row in a paged device pool; decode attends over all of them."""
import math

import torch

from synodic.kernels.sparse_attention import sparse_attention

from .base import KVPolicy
from .blocks import BlockManager


class ResidentKVPolicy(KVPolicy):
    # Every step op reads fixed-address tensors, so a decode step with this policy can be captured.
    graph_safe = True
    overlap_safe = True  # bind only stores buffers: nothing on the host waits for the step in flight
    def __init__(self, model, max_slots: int, device, cfg, max_seq_len: int):
        self.layers = model.attention_layers
        self.block_size = cfg.block_size
        bs = cfg.block_size
        self.blocks = BlockManager(cfg.num_blocks, bs, max_slots, max(1, -(-max_seq_len // bs)), device)
        dtype = next(model.parameters()).dtype
        # +1 page: the scratch page of padded rows.
        self.k = [torch.zeros(cfg.num_blocks + 1, bs, m.nkv, m.hd, device=device, dtype=dtype)
                  for m in self.layers]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.slot_ids = torch.zeros(0, dtype=torch.long, device=device)
        self.positions = self.slot_ids
        self.view_blocks = 1
        self._step = None  # (W, page, offset, ids) of the step's window, see _index

    # -- host-side, between steps -------------------------------------------------------------
    def bind(self, slot_ids: torch.Tensor, positions: torch.Tensor, view_blocks: int) -> None:
        """Batch rows (padding mapped to the scratch row), the new token's position per row, and how many pages of
        each row's table a step reads (a fixed bucket, so a captured graph stays valid)."""
        self.slot_ids = slot_ids
        self.positions = positions
        self.view_blocks = view_blocks
        self._step = None

    def graph_key(self) -> tuple:
        """Host state that picks a step's code path (none here); see TopKPolicy.graph_key."""
        return ()

    def view_blocks_for(self, max_len: int) -> int:
        need = self.blocks.blocks_for(max_len)
        return min(self.blocks.max_blocks_per_seq, 1 << max(0, math.ceil(math.log2(need))))

    # -- model-side ---------------------------------------------------------------------------
    def write_prefill(self, i: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        pos = torch.arange(start, start + k.shape[0], device=k.device)
        page = self.blocks.table[slot, pos // self.block_size].long()
        self.k[i][page, pos % self.block_size] = k.to(self.k[i].dtype)
        self.v[i][page, pos % self.block_size] = v.to(self.v[i].dtype)

    def attend(self, i: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """q [B, nq, hd], k_new/v_new [B, nkv, hd] of the token at self.positions → o [B, nq, hd]."""
        return self.attend_window(i, q[:, None], k_new[:, None], v_new[:, None])[:, 0]

    def attend_window(self, i: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """A window of W tokens per row at positions[b] + 0..W-1: q [B, W, nq, hd], k/v [B, W, nkv, hd]
        → o [B, W, nq, hd], causal inside the window. Rows past a later commit are simply
        overwritten by the next step (rollback is a length move).

        Attention reads the rows in place: each query gets the row ids of its positions 0..pos (its pages
        within the step's view, later positions -1) and `sparse_attention` (split-K Triton kernel on CUDA,
        the fp32 torch reference on CPU) gathers them — no [B, view, bs, nkv, hd] copy of the pages."""
        B, W, nq, hd = q.shape
        nkv = self.k[i].shape[2]
        if i == 0 or self._step is None or self._step[0] != W:  # the same for every layer of a step
            self._step = (W, *self._index(W, q.device))
        _, page, off, ids = self._step
        self.k[i][page, off] = k_new.to(self.k[i].dtype)
        self.v[i][page, off] = v_new.to(self.v[i].dtype)
        o = sparse_attention(q.reshape(B * W, nq, hd), self.k[i].view(-1, nkv, hd), self.v[i].view(-1, nkv, hd), ids)
        return o.view(B, W, nq, hd)

    def _index(self, W: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(page [B, W], offset [B, W]) of the window's new rows and the row ids [B * W, view * bs] each query
        attends to (positions 0..its own, -1 after). Computed by the first layer of every forward, so a
        captured step records it and the warm-up forwards' values are never reused."""
        bs, table = self.block_size, self.blocks.table
        pos = self.positions.long()[:, None] + torch.arange(W, device=device)  # [B, W]
        page = table[self.slot_ids[:, None], pos // bs].long()
        t = torch.arange(self.view_blocks * bs, device=device)
        rows = (table[self.slot_ids, : self.view_blocks, None] * bs + torch.arange(bs, device=device)).flatten(1)
        ids = torch.where(t[None, None, :] <= pos[:, :, None], rows[:, None, :].int(), -1)  # [B, W, view * bs]
        return page, pos % bs, ids.flatten(0, 1)

    # -- ledger -------------------------------------------------------------------------------
    def row_bytes(self) -> int:
        return sum(k[0, 0].numel() * k.element_size() * 2 for k in self.k)

    def bytes_for(self, lengths: list[int]) -> dict[str, int]:
        """Device KV bytes a decode step reads for rows of these context lengths (new token included)."""
        rows = sum(lengths)
        return {"kv_device_read": rows * self.row_bytes(), "kv_host_fetch": 0,
                "kv_selected_rows": rows * len(self.k), "kv_host_fetched_rows": 0}
