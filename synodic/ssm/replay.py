"""`ssm=replay`: checkpoint + ring of inputs per slot (REPLAYSSM.md). One cursor `write_pos` per slot
is shared by every SSM layer: the kernels run with advance=False and the runner moves the cursor
once per step (`end_step`), inside the same captured graph."""
import torch
from synodic.kernels.gdn_replay import gdn_replay_alloc, gdn_replay_decode, gdn_replay_flush, gdn_replay_verify
from synodic.kernels.mamba2_replay import (
    mamba2_replay_alloc,
    mamba2_replay_decode,
    mamba2_replay_flush,
    mamba2_replay_verify,
    replay_advance,
    replay_commit,
    replay_flush_reset,
)
from synodic.kernels.mamba2_replay.common import store_state

from .base import StateBackendBase

# precision → (checkpoint dtype, low-precision read copy dtype or None)
PRECISIONS = {
    "fp32": (torch.float32, None),
    "dual_bf16": (torch.float32, torch.bfloat16),
    "dual_fp8": (torch.float32, torch.float8_e4m3fn),
    "single_bf16": (torch.bfloat16, None),
    "single_fp8": (torch.float8_e4m3fn, None),
}


class ReplayStateBackend(StateBackendBase):
    def __init__(self, model, max_slots: int, device, cfg):
        super().__init__(model, max_slots, device)
        self.L, self.kernel, self.route = cfg.ring_len, cfg.kernel, cfg.gdn_route
        ck, lo = PRECISIONS[cfg.precision]
        dtype = next(model.parameters()).dtype
        self.write_pos = torch.zeros(max_slots, dtype=torch.int32, device=device)
        self.host_wp = [0] * max_slots  # mirror of write_pos for the byte ledger (no device reads)
        self.cache = []
        for m in self.layers:
            if hasattr(m, "P"):
                c = mamba2_replay_alloc(max_slots, m.H, m.P, m.N, m.G, self.L, dtype=dtype, ckpt_dtype=ck,
                                        lo_dtype=lo, device=device)
            else:
                c = gdn_replay_alloc(max_slots, m.HV, m.V, m.K, m.Hk, self.L, dtype=dtype, ckpt_dtype=ck,
                                     lo_dtype=lo, device=device)
            c["write_pos"] = self.write_pos
            self.cache.append(c)

    def _seed_state(self, i, slot, state):
        c = self.cache[i]
        store_state(c["ckpt"][slot], c["ckpt_scale"][slot] if "ckpt_scale" in c else None, state.float())
        if "ckpt_lo" in c:
            store_state(c["ckpt_lo"][slot], c["ckpt_lo_scale"][slot] if "ckpt_lo_scale" in c else None,
                        state.float())
        self.write_pos[slot] = 0
        self.host_wp[slot] = 0

    def mamba2_step(self, i, x, dt, A, B, C, D, dt_bias):
        return mamba2_replay_decode(**self.cache[i], x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias,
                                    slot_ids=self.slot_ids, L=self.L, advance=False, backend=self.kernel)

    def gdn_step(self, i, q, k, v, g, beta):
        return gdn_replay_decode(**self.cache[i], q=q, k=k, v=v, g=g, beta=beta, slot_ids=self.slot_ids,
                                 L=self.L, route=self.route, advance=False, backend=self.kernel)

    def end_step(self) -> None:
        replay_advance(self.write_pos, self.slot_ids, L=self.L)

    # -- speculative window: flush early so the window never straddles a flush, verify without
    #    writing any state, commit by moving the cursor --------------------------------------------
    def begin_window(self, T: int) -> None:
        if T > self.L:
            raise ValueError(f"verify window T={T} exceeds ssm.ring_len={self.L}")
        for c, m in zip(self.cache, self.layers):
            if hasattr(m, "P"):
                mamba2_replay_flush(**c, A=-torch.exp(m.A_log.float()), slot_ids=self.slot_ids, L=self.L,
                                    min_room=T, advance=False, backend=self.kernel)
            else:
                gdn_replay_flush(**c, slot_ids=self.slot_ids, L=self.L, min_room=T, advance=False,
                                 backend=self.kernel)
        replay_flush_reset(self.write_pos, self.slot_ids, L=self.L, min_room=T)

    def mamba2_verify(self, i, x, dt, A, B, C, D, dt_bias):
        return mamba2_replay_verify(**self.cache[i], x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias,
                                    slot_ids=self.slot_ids, L=self.L, backend=self.kernel)

    def gdn_verify(self, i, q, k, v, g, beta):
        return gdn_replay_verify(**self.cache[i], q=q, k=k, v=v, g=g, beta=beta, slot_ids=self.slot_ids,
                                 L=self.L, backend=self.kernel)

    def _commit_state(self, accepted: torch.Tensor) -> None:
        replay_commit(self.write_pos, accepted, self.slot_ids, L=self.L)

    # -- ledger: exact bytes of the layouts, per the cursor of each row -----------------------------
    def _layer_bytes(self, c, wp: int) -> tuple[int, int, int]:
        """(state read, state write, ring read+write) of one row of one layer at cursor wp."""
        def row(name):
            t = c.get(name)
            return 0 if t is None else t[0].numel() * t.element_size()

        ring_names = [k for k in c if k.startswith("ring_")]
        entry = sum(row(n) // self.L for n in ring_names)  # one position of every ring tensor
        ck = row("ckpt") + row("ckpt_scale")
        lo = row("ckpt_lo") + row("ckpt_lo_scale")
        if wp >= self.L - 1:  # flush: fp32 recurrence reads ckpt + ring, writes ckpt (+ refreshes copy)
            return ck, ck + lo, wp * entry
        return (lo or ck), 0, wp * entry + entry

    def _window_bytes(self, c, wp: int, T: int) -> tuple[int, int, int]:
        """A window: an early flush when wp + T > L (read ckpt + ring, write ckpt), then the verify
        reads the checkpoint (or its low-precision copy) and ring[:wp'] and writes T ring entries."""
        def row(name):
            t = c.get(name)
            return 0 if t is None else t[0].numel() * t.element_size()
        entry = sum(row(n) // self.L for n in c if n.startswith("ring_"))
        ck = row("ckpt") + row("ckpt_scale")
        lo = row("ckpt_lo") + row("ckpt_lo_scale")
        read = write = ring = 0
        if wp > 0 and wp + T > self.L:
            read, write, ring, wp = ck, ck + lo, wp * entry, 0
        return read + (lo or ck), write, ring + wp * entry + T * entry

    def step_bytes(self, slots: list[int], T: int = 1, accepted: list[int] | None = None) -> dict[str, int]:
        """Plain step (T = 1), or a verify window of T committing accepted[i] tokens per row."""
        read = write = ring = 0
        for j, s in enumerate(slots):
            wp = self.host_wp[s]
            for c in self.cache:
                if T == 1:
                    r, w, g = self._layer_bytes(c, wp)
                else:
                    r, w, g = self._window_bytes(c, wp, T)
                read, write, ring = read + r, write + w, ring + g
            if T == 1:
                self.host_wp[s] = 0 if wp >= self.L - 1 else wp + 1
            else:
                base = 0 if (wp > 0 and wp + T > self.L) else wp
                self.host_wp[s] = min(self.L, base + accepted[j])
        return {"ssm_state_read": read, "ssm_state_write": write, "ssm_ring": ring,
                "ssm_conv_state": 2 * self.conv_bytes_per_step(len(slots))}
