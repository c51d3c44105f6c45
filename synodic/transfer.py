"""Host ↔ device copies that do not wait for the whole stream, so a decode step can be queued behind the one
still running (overlapped decoding). A copy from pageable host memory synchronises; page-locked buffers come
from torch's caching host allocator, which keeps a buffer alive until the copy that reads it has run."""
import torch


def pinned(t: torch.Tensor, device) -> torch.Tensor:
    """t in page-locked memory when it is bound for a GPU (copy it with non_blocking=True), else t."""
    return t.pin_memory() if torch.device(device).type == "cuda" else t


class PendingTokens:
    """Tokens on their way to the host: a device → page-locked copy queued behind the work already queued."""

    def __init__(self, tokens: torch.Tensor):
        cuda = tokens.is_cuda
        self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=cuda)
        self._host.copy_(tokens, non_blocking=cuda)
        self._event = None
        if cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()  # this copy only, not the work queued after it
        return self._host.tolist()
