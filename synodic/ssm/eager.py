"""`ssm=eager`: one full recurrent state per slot, read and written every decode step
(mamba_ssm `selective_state_update` / FLA fused-recurrent semantics).

With a verify window of W = 1 + drafts (the speculative baseline of today's engines) every slot owns
W state buffers: a window step reads the current one once and writes one state per window position;
committing `accepted` tokens makes buffer accepted−1 current (a cursor move on the device)."""
import torch

from synodic.kernels.gdn_decode import gdn_decode
from synodic.kernels.mamba2_decode import mamba2_decode

from .base import StateBackend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EagerStateBackend(StateBackend):
    rolls_back = True

    def __init__(self, model, max_slots: int, device, cfg, window: int = 1):
        super().__init__(model, max_slots, device)
        self.kernel = cfg.kernel
        self.W = window
        dt = DTYPES[cfg.state_dtype]
        self.state = []
        for m in self.layers:
            shape = (m.H, m.P, m.N) if hasattr(m, "P") else (m.HV, m.V, m.K)
            self.state.append(torch.zeros(max_slots * window, *shape, device=device, dtype=dt))
        # current buffer per slot, + the scratch entry that padding rows commit to
        self.cur = torch.zeros(max_slots + 1, dtype=torch.long, device=device)

    def _physical(self, slot_ids, offset=None):
        safe = slot_ids.clamp(min=0)
        buf = self.cur[safe] if offset is None else offset
        return torch.where(slot_ids < 0, slot_ids, safe * self.W + buf)

    def _seed_state(self, i, slot, state):
        self.cur[slot] = 0
        self.state[i][slot * self.W] = state.to(self.state[i].dtype)

    def _rows(self):
        # the runner's fixed slot buffer itself when W == 1; otherwise a device op inside the step, so
        # a captured graph recomputes it from the current cursors
        return self.slot_ids if self.W == 1 else self._physical(self.slot_ids)

    def mamba2_step(self, i, x, dt, A, B, C, D, dt_bias):
        return mamba2_decode(self.state[i], x, dt, A, B, C, D, dt_bias, self._rows(), backend=self.kernel)

    def gdn_step(self, i, q, k, v, g, beta):
        return gdn_decode(self.state[i], q, k, v, g, beta, self._rows(), backend=self.kernel)

    # -- speculative window -------------------------------------------------------------------
    def begin_window(self, T: int) -> None:
        if T > self.W:
            raise ValueError(f"verify window T={T} exceeds the {self.W} state buffers per slot; "
                             "build the graph with window >= T")
        src = self._physical(self.slot_ids)
        t = torch.arange(T, device=src.device)
        dst = self.slot_ids.clamp(min=0)[:, None] * self.W + t  # buffer t gets the state after token t
        self._src, self._dst = src, torch.where(self.slot_ids[:, None] < 0, -1, dst)

    def mamba2_verify(self, i, x, dt, A, B, C, D, dt_bias):
        from synodic.kernels.mamba2_window import mamba2_decode_window
        return mamba2_decode_window(self.state[i], x, dt, A, B, C, D, dt_bias, self._src, self._dst,
                                    backend=self.kernel)

    def gdn_verify(self, i, q, k, v, g, beta):
        from synodic.kernels.gdn_window import gdn_decode_window
        return gdn_decode_window(self.state[i], q, k, v, g, beta, self._src, self._dst, backend=self.kernel)

    def _commit_state(self, accepted: torch.Tensor) -> None:
        # rows, not a boolean mask of the real ones: no host sync, so a captured step can commit
        self.cur.index_copy_(0, self._conv_rows, accepted.long() - 1)

    # -- ledger -------------------------------------------------------------------------------
    def step_bytes(self, slots: list[int], T: int = 1, accepted=None) -> dict[str, int]:
        """A step reads each row's state once and writes T states (T = 1: plain decoding)."""
        per_seq = sum(s[0].numel() * s.element_size() for s in self.state)
        b = len(slots)
        return {"ssm_state_read": b * per_seq, "ssm_state_write": b * T * per_seq, "ssm_ring": 0,
                "ssm_conv_state": 2 * self.conv_bytes_per_step(b)}
