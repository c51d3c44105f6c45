"""Sampled tokens back to the host without stalling the stream: a device → pinned-host copy and an event,
waited on later. With two buffers, step N's tokens are read while step N + 1 runs (overlapped decoding)."""
import torch


class PendingTokens:
    def __init__(self, host: torch.Tensor, event, n: int):
        self._host, self._event, self.n = host, event, n

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()  # this step's copy only, not the work queued after it
        return self._host[: self.n].tolist()


class TokenReadback:
    def __init__(self, max_rows: int, device):
        self.cuda = torch.device(device).type == "cuda"
        # two buffers: at most one step is read back while the next one is in flight
        self._bufs = [torch.zeros(max_rows, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self._i = 0

    def start(self, tokens: torch.Tensor) -> PendingTokens:
        """tokens [n] on the device: copy them to host memory behind the work already queued."""
        buf = self._bufs[self._i]
        self._i ^= 1
        n = tokens.shape[0]
        buf[:n].copy_(tokens, non_blocking=self.cuda)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return PendingTokens(buf, event, n)
