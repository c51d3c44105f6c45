"""What every SSM state backend shares: per-slot conv state, slot binding, and the byte ledger hook.

Slots: rows 0..max_slots-1 belong to requests; row max_slots is scratch for padded batch rows
(CUDA-graph buckets), which the SSM kernels skip through a negative slot id.
"""
import torch
import torch.nn.functional as F


class StateBackendBase:
    def __init__(self, model, max_slots: int, device):
        self.max_slots = max_slots
        self.device = torch.device(device)
        self.layers = model.ssm_layers
        dtype = next(model.parameters()).dtype
        self.conv = [torch.zeros(max_slots + 1, m.conv_dim, m.conv1d.weight.shape[-1] - 1,
                                 device=device, dtype=dtype) for m in self.layers]
        self.slot_ids = torch.zeros(0, dtype=torch.long, device=device)
        self._conv_rows = self.slot_ids

    def bind(self, slot_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """The batch's slots (negative = padding row, skipped by the kernels) and the same with padding
        mapped to the scratch row; both fixed-address buffers of the runner."""
        self.slot_ids = slot_ids
        self._conv_rows = rows

    def conv_step(self, i: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One causal-conv step (+SiLU) for layer i: x [B, C] → y [B, C]; the window shifts in place."""
        rows = self._conv_rows
        full = torch.cat([self.conv[i][rows], x[..., None].to(self.conv[i].dtype)], dim=-1)
        self.conv[i].index_copy_(0, rows, full[..., 1:])
        return F.silu((full * weight).sum(-1) + bias).to(x.dtype)

    def seed(self, i: int, slot: int, state: torch.Tensor, conv_state: torch.Tensor) -> None:
        """Prefill's final state of layer i for `slot`."""
        self.conv[i][slot] = conv_state.to(self.conv[i].dtype)
        self._seed_state(i, slot, state)

    def end_step(self) -> None:
        """Called once after every layer ran a decode step (cursor moves for backends that keep one)."""

    def conv_bytes_per_step(self, batch: int) -> int:
        return batch * sum(c[0].numel() * c.element_size() for c in self.conv)

    def _seed_state(self, i, slot, state):
        raise NotImplementedError
