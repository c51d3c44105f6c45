"""`ssm=replay`: checkpoint + ring of inputs per slot (docs/replayssm.md). One cursor `write_pos` per slot
is shared by every SSM layer: the kernels run with advance=False and the runner moves the cursor
once per step (`end_step`), inside the same captured graph."""
import numpy as np
import torch

from synodic.kernels.gdn_replay import gdn_replay_alloc, gdn_replay_decode, gdn_replay_flush, gdn_replay_verify
from synodic.kernels.mamba2_replay import (
    mamba2_replay_alloc,
    mamba2_replay_decode,
    mamba2_replay_flush,
    mamba2_replay_verify,
)
from synodic.kernels.replay_common import replay_advance, replay_commit, replay_flush_reset, store_state

from .base import StateBackend

# precision → (checkpoint dtype, low-precision read copy dtype or None)
PRECISIONS = {
    "fp32": (torch.float32, None),
    "dual_bf16": (torch.float32, torch.bfloat16),
    "dual_fp8": (torch.float32, torch.float8_e4m3fn),
    "single_bf16": (torch.bfloat16, None),
    "single_fp8": (torch.float8_e4m3fn, None),
}


class ReplayStateBackend(StateBackend):
    rolls_back = True

    def __init__(self, model, max_slots: int, device, cfg):
        super().__init__(model, max_slots, device)
        self.L, self.kernel, self.route = cfg.ring_len, cfg.kernel, cfg.gdn_route
        ck, lo = PRECISIONS[cfg.precision]
        dtype = next(model.parameters()).dtype
        self.write_pos = torch.zeros(max_slots, dtype=torch.int32, device=device)
        self.host_wp = np.zeros(max_slots, dtype=np.int64)  # write_pos mirror for the ledger (no device reads)
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
        self._ledger_constants()

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
                mamba2_replay_flush(**c, A=m.A(),  # (cached: three launches a layer otherwise)
                                    slot_ids=self.slot_ids, L=self.L,
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
    # Every layer of a row shares the row's cursor, so a step's bytes are per-row sums of per-layer
    # constants: summed once here, a step costs a few numpy ops instead of a Python loop over rows x
    # layers (that loop, ~10^4 tensor views at batch 256, sat between a step's read-back and the next launch).
    def _ledger_constants(self) -> None:
        def row(c, name):
            t = c.get(name)
            return 0 if t is None else t[0].numel() * t.element_size()
        E = CK = LO = R0 = 0
        for c in self.cache:
            E += sum(row(c, n) // self.L for n in c if n.startswith("ring_"))  # one position of every ring
            ck = row(c, "ckpt") + row(c, "ckpt_scale")
            lo = row(c, "ckpt_lo") + row(c, "ckpt_lo_scale")
            CK, LO, R0 = CK + ck, LO + lo, R0 + (lo or ck)  # a step reads the low-precision copy if any
        self._E, self._CK, self._LO, self._R0 = E, CK, LO, R0

    def host_step(self, slots: list[int], T: int = 1, accepted: list[int] | None = None) -> None:
        """Move the host's cursor mirror as the step's kernels moved the device cursors (the same rules as
        step_bytes), once the step has been accounted."""
        idx = np.asarray(slots, dtype=np.int64)
        wp = self.host_wp[idx]
        if accepted is None:  # a plain step (a verify window of one token flushes by the window rule)
            self.host_wp[idx] = np.where(wp >= self.L - 1, 0, wp + 1)
        else:
            early = (wp > 0) & (wp + T > self.L)
            self.host_wp[idx] = np.minimum(self.L, np.where(early, 0, wp) + np.asarray(accepted, dtype=np.int64))

    def step_bytes(self, slots: list[int], T: int = 1, accepted: list[int] | None = None) -> dict[str, int]:
        """Plain step (accepted None), or a verify window of T (T >= 1) committing accepted[i] tokens per row.
        Plain: a row at cursor wp reads the checkpoint (or its copy) and ring[:wp] and appends one entry;
        at wp = L - 1 it flushes instead: reads ckpt + ring[:wp], writes ckpt (+ refreshes the copy).
        Window: an early flush when wp > 0 and wp + T > L, then the verify reads the checkpoint (or
        copy) and ring[:wp'] and writes T entries; the cursor moves to wp' + accepted."""
        idx = np.asarray(slots, dtype=np.int64)
        wp = self.host_wp[idx]
        n = len(idx)
        if accepted is None:  # a plain step (a verify window of one token flushes by the window rule)
            flush = int((wp >= self.L - 1).sum())
            read = flush * self._CK + (n - flush) * self._R0
            ring = self._E * (int(wp.sum()) + n - flush)
        else:
            early = (wp > 0) & (wp + T > self.L)
            flush = int(early.sum())
            read = flush * self._CK + n * self._R0
            ring = self._E * (int(wp.sum()) + n * T)
        return {"ssm_state_read": read, "ssm_state_write": flush * (self._CK + self._LO), "ssm_ring": ring,
                "ssm_conv_state": 2 * self.conv_bytes_per_step(n)}
