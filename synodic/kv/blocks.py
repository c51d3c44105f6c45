"""Host-side page allocator for the paged KV pool; mirrors its decisions into the device block table."""
import torch

from synodic.transfer import pinned


class BlockManager:
    # Growing one request never takes pages another request holds (kv=adaptive's blocks may: demotion).
    evicts = False

    def __init__(self, num_blocks: int, block_size: int, max_slots: int, max_blocks_per_seq: int, device):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.owned: dict[int, list[int]] = {}
        # Row max_slots is the scratch slot of padded rows; its pages all point at the scratch page
        # `num_blocks` so their writes never touch a request's KV.
        self.table = torch.full((max_slots + 1, max_blocks_per_seq), num_blocks, dtype=torch.int32,
                                device=device)
        self.max_blocks_per_seq = max_blocks_per_seq

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_grow(self, slot: int, tokens: int) -> bool:
        need = self.blocks_for(tokens) - len(self.owned.get(slot, []))
        return need <= len(self.free) and self.blocks_for(tokens) <= self.max_blocks_per_seq

    def grow(self, slot: int, tokens: int) -> None:
        """Ensure `slot` owns pages for `tokens` tokens (caller checked can_grow)."""
        mine = self.owned.setdefault(slot, [])
        new = []
        while len(mine) < self.blocks_for(tokens):
            new.append(self.free.pop())
            mine.append(new[-1])
        if new:
            start = len(mine) - len(new)
            vals = pinned(torch.tensor(new, dtype=torch.int32), self.table.device)
            self.table[slot, start:len(mine)].copy_(vals, non_blocking=True)  # no wait for a step in flight

    def release(self, slot: int) -> None:
        self.free.extend(reversed(self.owned.pop(slot, [])))
        self.table[slot].fill_(self.num_blocks)

    def used(self) -> int:
        return self.num_blocks - len(self.free)
