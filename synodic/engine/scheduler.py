"""Continuous batching: admit by free state slots and KV pages, grow pages each step, and preempt the
youngest request (to be recomputed later) when pages run out. Nothing here ever raises on exhaustion."""
from collections import deque

from .request import Request, Status


class Scheduler:
    def __init__(self, max_slots: int, blocks, max_running: int):
        self.blocks = blocks  # BlockManager of the KV policy (or None for attention-free models)
        self.max_running = min(max_running, max_slots)
        self.free_slots = list(range(max_slots - 1, -1, -1))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _fits_ever(self, tokens: int) -> bool:
        b = self.blocks
        return b is None or (b.blocks_for(tokens) <= b.num_blocks and b.blocks_for(tokens) <= b.max_blocks_per_seq)

    def admit(self) -> list[Request]:
        """Requests to prefill now (their context gets pages for length + 1 tokens)."""
        out = []
        while self.waiting and len(self.running) < self.max_running and self.free_slots:
            r = self.waiting[0]
            if not self._fits_ever(r.length + 1):
                self.waiting.popleft()
                self.finish(r, "rejected_kv_capacity", release=False)
                continue
            slot = self.free_slots[-1]
            if self.blocks is not None and not self.blocks.can_grow(slot, r.length + 1):
                break  # wait for pages to free up
            self.waiting.popleft()
            self.free_slots.pop()
            r.slot, r.status = slot, Status.RUNNING
            if self.blocks is not None:
                self.blocks.grow(slot, r.length + 1)
            self.running.append(r)
            out.append(r)
        return out

    def grow(self) -> list[Request]:
        """Give every running request pages for its next token, preempting the youngest when short.
        Returns the requests preempted this step."""
        preempted = []
        if self.blocks is None:
            return preempted
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if self.blocks.can_grow(r.slot, r.length):
                self.blocks.grow(r.slot, r.length)
                i += 1
                continue
            if not self._fits_ever(r.length):
                self.finish(r, "kv_capacity")
                continue
            victim = self.running[-1]
            if victim is r and len(self.running) == 1:
                self.finish(r, "kv_capacity")  # alone and still out of pages
                continue
            self.running.pop()
            self._release(victim)
            victim.status, victim.slot = Status.WAITING, -1
            victim.preemptions += 1
            self.waiting.appendleft(victim)
            preempted.append(victim)
        return preempted

    def reserve(self, rows: list[Request], extra: int, free_only: bool = False) -> bool:
        """Pages for each row to hold r.length + extra tokens (a queued overlapped step: extra = 1; a verify
        window of T: T - 1), row by row; False at the first row that cannot have them. free_only: only from
        free pages, never by a policy taking other requests' pages (kv=adaptive's demotion)."""
        if self.blocks is None:
            return True
        for r in rows:
            n = r.length + extra
            if not self.blocks.can_grow(r.slot, n) or (free_only and self.blocks.evicts
                                                        and not self.blocks.fits_free(r.slot, n)):
                return False
            self.blocks.grow(r.slot, n)
        return True

    def hold(self, slots: list[int], tokens: int) -> None:
        """Fresh pages for raw slots outside request bookkeeping (the teacher-forced scorer, the bench
        pipeline): each slot's pages released, then grown to `tokens`."""
        if self.blocks is None:
            return
        for s in slots:
            self.blocks.release(s)
            self.blocks.grow(s, tokens)

    def _release(self, r: Request) -> None:
        if self.blocks is not None:
            self.blocks.release(r.slot)
        self.free_slots.append(r.slot)

    def finish(self, r: Request, reason: str, release: bool = True) -> None:
        if release and r in self.running:
            self.running.remove(r)
            self._release(r)
        r.status, r.finish_reason = Status.FINISHED, reason
        self.finished.append(r)
