"""Byte ledger: what each store read and wrote per decode step, from the backends' own layouts."""
from collections import defaultdict

BYTE_KEYS = ("ssm_state_read", "ssm_state_write", "ssm_ring", "kv_device_read", "kv_host_fetch",
             "weights_read", "draft_weights_read", "draft_kv")
ROW_KEYS = ("kv_selected_rows", "kv_host_fetched_rows")


class ByteLedger:
    def __init__(self):
        self.steps = 0
        self.tokens = 0
        self.totals: dict[str, float] = defaultdict(int)

    def add(self, batch: int, entry: dict[str, int]) -> None:
        self.steps += 1
        self.tokens += batch
        for k, v in entry.items():
            self.totals[k] += v  # bytes and rows are ints; rates (per-layer miss rate) stay floats

    def summary(self) -> dict:
        n = max(self.steps, 1)
        per_step = {k: self.totals.get(k, 0) / n for k in BYTE_KEYS}
        per_step.update({k: v / n for k, v in self.totals.items() if k not in BYTE_KEYS + ROW_KEYS})
        sel, fetched = self.totals.get("kv_selected_rows", 0), self.totals.get("kv_host_fetched_rows", 0)
        return {
            "decode_steps": self.steps,
            "decode_tokens": self.tokens,
            "bytes_per_step": per_step,
            "ssm_bytes_per_token": (self.totals["ssm_state_read"] + self.totals["ssm_state_write"]
                                    + self.totals["ssm_ring"]) / max(self.tokens, 1),
            "kv": {"selected_rows": sel, "host_fetched_rows": fetched,
                   "host_fetch_fraction": fetched / sel if sel else 0.0},
        }
