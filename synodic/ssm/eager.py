"""`ssm=eager`: one full recurrent state per slot, read and written every decode step
(mamba_ssm `selective_state_update` / FLA fused-recurrent semantics)."""
import torch
from synodic.kernels.gdn_decode import gdn_decode
from synodic.kernels.mamba2_decode import mamba2_decode

from .base import StateBackendBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EagerStateBackend(StateBackendBase):
    def __init__(self, model, max_slots: int, device, cfg):
        super().__init__(model, max_slots, device)
        self.kernel = cfg.kernel
        dt = DTYPES[cfg.state_dtype]
        self.state = []
        for m in self.layers:
            shape = (m.H, m.P, m.N) if hasattr(m, "P") else (m.HV, m.V, m.K)
            self.state.append(torch.zeros(max_slots, *shape, device=device, dtype=dt))

    def _seed_state(self, i, slot, state):
        self.state[i][slot] = state.to(self.state[i].dtype)

    def mamba2_step(self, i, x, dt, A, B, C, D, dt_bias):
        return mamba2_decode(self.state[i], x, dt, A, B, C, D, dt_bias, self.slot_ids, backend=self.kernel)

    def gdn_step(self, i, q, k, v, g, beta):
        return gdn_decode(self.state[i], q, k, v, g, beta, self.slot_ids, backend=self.kernel)

    def step_bytes(self, slots: list[int]) -> dict[str, int]:
        batch = len(slots)
        per_seq = sum(s[0].numel() * s.element_size() for s in self.state)
        return {"ssm_state_read": batch * per_seq, "ssm_state_write": batch * per_seq, "ssm_ring": 0,
                "ssm_conv_state": 2 * self.conv_bytes_per_step(batch)}
