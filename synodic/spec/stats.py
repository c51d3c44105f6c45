"""Speculative decoding counters: acceptance by draft position, drafted / accepted / emitted tokens, and the
draft and verify wall time per step (on a GPU these time the host's launches unless something syncs; the
step's one read-back closes the verify time)."""


class SpecStats:
    def __init__(self):
        self.steps = 0           # steps of the speculative loop (a verify forward or a plain decode step each)
        self.plain_steps = 0     # of those, steps no row drafted in: run as the plain decode step, no window
        self.row_verifies = 0    # rows verified with at least one draft
        self.plain_rows = 0      # rows stepped without drafts (no n-gram match, or pages for one token only)
        self.drafted = 0
        self.accepted = 0
        self.emitted = 0         # tokens appended to outputs (a row finishing mid-window keeps fewer)
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.pos_drafted: list[int] = []   # rows with a draft at position k (0-based)
        self.pos_accepted: list[int] = []  # ... whose draft k was accepted

    def add(self, n_drafts: list[int], accepted: list[int], emitted: int, draft_s: float, verify_s: float,
            plain: bool = False) -> None:
        self.steps += 1
        self.plain_steps += plain
        self.emitted += emitted
        self.draft_s += draft_s
        self.verify_s += verify_s
        if not any(n_drafts):  # (a plain step: no per-row loop on the host between overlapped steps)
            self.plain_rows += len(n_drafts)
            return
        for n, m in zip(n_drafts, accepted):
            if n == 0:
                self.plain_rows += 1
                continue
            self.row_verifies += 1
            self.drafted += n
            self.accepted += m
            while len(self.pos_drafted) < n:
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            for k in range(n):
                self.pos_drafted[k] += 1
                self.pos_accepted[k] += k < m

    def summary(self) -> dict:
        rv = max(self.row_verifies, 1)
        return {
            "steps": self.steps, "plain_steps": self.plain_steps,
            "mean_acceptance_length": (self.accepted + self.row_verifies) / rv if self.row_verifies else None,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "acceptance_rate_by_position": [a / d if d else None for a, d in zip(self.pos_accepted, self.pos_drafted)],
            "drafted_tokens": self.drafted, "accepted_tokens": self.accepted, "emitted_tokens": self.emitted,
            "row_verifies": self.row_verifies, "rows_without_drafts": self.plain_rows,
            "draft_ms_per_step": 1e3 * self.draft_s / max(self.steps, 1),
            "verify_ms_per_step": 1e3 * self.verify_s / max(self.steps, 1),
        }
