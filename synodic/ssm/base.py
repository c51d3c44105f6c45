"""The SSM state backend base: per-slot conv state, slot binding, and the hooks the engine calls (window,
commit, end of step, the byte ledger and its host mirror), with their defaults.

Slots: rows 0..max_slots-1 belong to requests; row max_slots is scratch for padded batch rows
(CUDA-graph buckets), which the SSM kernels skip through a negative slot id.
"""
import torch

from synodic.kernels.conv1d_update import conv1d_update, new_conv_state
from synodic.kernels.conv1d_window import conv1d_window, conv1d_window_commit


class StateBackend:
    """Base of every `ssm` backend. Subclasses provide mamba2_step / gdn_step (and *_verify for windows),
    step_bytes, and override the hooks below where they keep more than the state itself."""

    # commit() keeps only a verify window's accepted prefix (speculative decoding needs it)
    rolls_back = False

    def __init__(self, model, max_slots: int, device):
        self.max_slots = max_slots
        self.device = torch.device(device)
        self.kernel = "auto"  # kernel backend (subclasses set theirs from the config)
        self.layers = model.ssm_layers
        dtype = next(model.parameters()).dtype
        self.conv = [new_conv_state(max_slots + 1, m.conv_dim, m.conv1d.weight.shape[-1] - 1, device=device,
                                    dtype=dtype) for m in self.layers]
        self._conv_row_bytes = sum(c[0].numel() * c.element_size() for c in self.conv)  # the ledger's, per step
        self.slot_ids = torch.zeros(0, dtype=torch.long, device=device)
        self._conv_rows = self.slot_ids
        self._window: dict[int, torch.Tensor] = {}

    def bind(self, slot_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """The batch's slots (negative = padding row, skipped by the kernels) and the same with padding
        mapped to the scratch row; both fixed-address buffers of the runner."""
        self.slot_ids = slot_ids
        self._conv_rows = rows

    def conv_step(self, i: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One causal-conv step (+SiLU) for layer i: x [B, C] → y [B, C]; the window shifts in place
        (one fused kernel; padding rows touch no state and give y = 0)."""
        return conv1d_update(x, self.conv[i], weight, bias, self.slot_ids, backend=self.kernel)

    def conv_window(self, i: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Causal conv over a verify window x [B, T, C] from the committed conv state, without
        committing: the window inputs are kept until `commit` knows how many were accepted (one fused
        kernel each way)."""
        self._window[i] = x
        return conv1d_window(x, self.conv[i], weight, bias, self._conv_rows, backend=self.kernel)

    def commit(self, accepted: torch.Tensor) -> None:
        """After a verify: keep `accepted` [B] (device, 1..T) window tokens per row; no host sync."""
        for i, x in self._window.items():
            conv1d_window_commit(x, self.conv[i], self._conv_rows, accepted, backend=self.kernel)
        self._window = {}
        self._commit_state(accepted)

    def begin_window(self, T: int) -> None:
        """Before a verify window of T tokens (backends flush or pick state slots here)."""

    def _commit_state(self, accepted: torch.Tensor) -> None:
        raise NotImplementedError

    def seed(self, i: int, slot: int, state: torch.Tensor, conv_state: torch.Tensor) -> None:
        """Prefill's final state of layer i for `slot`."""
        self.conv[i][slot] = conv_state.to(self.conv[i].dtype)
        self._seed_state(i, slot, state)

    def host_step(self, slots: list[int], T: int = 1, accepted: list[int] | None = None) -> None:
        """After the engine has accounted a step: advance any host-side mirror (none by default)."""

    def end_step(self) -> None:
        """Called once after every layer ran a decode step (cursor moves for backends that keep one)."""

    def conv_bytes_per_step(self, batch: int) -> int:
        return batch * self._conv_row_bytes

    def _seed_state(self, i, slot, state):
        raise NotImplementedError
