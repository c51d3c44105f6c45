"""Runs the model: prefill one prompt, one decode step over a batch, or one greedy speculative step (draft +
verify + commit), optionally replaying a CUDA graph per (batch bucket, KV view, KV policy's graph_key[, γ])
from fixed-address buffers."""
import time

import numpy as np
import torch

from synodic.engine.blas import blas_for
from synodic.models.lm import DecodeContext, PrefillContext, VerifyContext
from synodic.spec.verify import verify
from synodic.transfer import pinned


class ModelRunner:
    def __init__(self, model, ssm, kv, max_slots: int, device, cuda_graphs: bool):
        self.model, self.ssm, self.kv = model, ssm, kv
        self.max_slots = max_slots
        self.device = torch.device(device)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        n = max_slots
        # ids, positions, slots, rows: views of one buffer, so a step's inputs reach the device in one copy
        # (a copy from pageable host memory synchronises the stream)
        self.inputs = torch.zeros(4, n, dtype=torch.long, device=device)
        self.ids = self.inputs[0].view(n, 1)
        self.pos = self.inputs[1]
        self.slots = self.inputs[2]
        self.rows = self.inputs[3]
        self.slots.fill_(-1)  # -1 = padding row
        self.rows.fill_(n)    # padding → scratch row n
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._draft_inputs: dict[int, torch.Tensor] = {}  # gamma → staged drafts [max_slots, 1 + gamma]
        self.pool = None
        self.capture_s = 0.0  # wall time spent capturing graphs (warm-up work, kept out of decode rates)
        # target blocks whose residual stream prefill / verify also return (a neural drafter's context), and the
        # last such forward's hidden states [b, T, k*H], left on the device
        self.hidden_layers: tuple[int, ...] = ()
        self.hidden: torch.Tensor | None = None
        # every row's tokens by position [max_slots + 1, width], for drafters that look up the context on the
        # device (track_history); written by the forwards that already run, so no step reads tokens back for it
        self.history: torch.Tensor | None = None
        self._last_spec: torch.Tensor | None = None  # the last speculate's output (speculate_next chains from it)
        # the activation dtype picks the GEMM library (engine/blas.py); quantized weights are not floating point,
        # and a model without floating parameters runs in fp32
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def track_history(self, width: int) -> torch.Tensor:
        """Keep each slot's tokens on the device at their positions (< width; the scratch row takes padding)."""
        self.history = torch.zeros(self.max_slots + 1, width, dtype=torch.long, device=self.device)
        return self.history

    def _keep_tokens(self, rows: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> None:
        """ids [B, T] at positions[i].. of rows into the history. Window tokens past what a row accepts are
        written too: they lie beyond its committed length, which is all a lookup reads, and later steps overwrite
        them."""
        if self.history is not None:
            t = torch.arange(ids.shape[1], device=ids.device)
            at = (positions[:, None] + t).clamp(max=self.history.shape[1] - 1)
            self.history[rows[:, None], at] = ids

    def prefill(self, slot: int, tokens: list[int]) -> torch.Tensor:
        """Runs the whole context through the model, seeding `slot`; returns the last logits [V]."""
        return self.prefill_batch([slot], [tokens])[0]

    @property
    def batched_prefill(self) -> bool:
        """Whether one forward may prefill several prompts (not with a KV policy's sparse prefill)."""
        return self.kv is None or self.kv.prefill_attend is None

    @torch.inference_mode()
    def prefill_batch(self, slots: list[int], contexts: list[list[int]]) -> torch.Tensor:
        """Prompts of equal length in one forward, row i seeding slots[i]; returns the last logits [n, V]."""
        if len({len(c) for c in contexts}) != 1 or len(slots) != len(contexts):
            raise ValueError(f"prefill_batch: expected one context per slot, all of one length; got {len(slots)} "
                             f"slots, lengths {sorted({len(c) for c in contexts})}")
        if len(slots) > 1 and not self.batched_prefill:
            raise ValueError(f"prefill_batch: kv={self.kv.cfg.kind} prefills one sequence per forward, got "
                             f"{len(slots)}")
        ids = torch.tensor(contexts, dtype=torch.long, device=self.device)
        ctx = PrefillContext(ssm=self.ssm, kv=self.kv, slots=list(slots), start=0)
        if self.history is not None:
            self.history[torch.tensor(slots, device=self.device), :ids.shape[1]] = ids
        with blas_for(ids.numel(), self.dtype, self.device):
            return self._run(ids, ctx)[:, -1]

    def _run(self, ids, ctx) -> torch.Tensor:
        if not self.hidden_layers:
            return self.model(ids, ctx)
        logits, self.hidden = self.model(ids, ctx, hidden_layers=self.hidden_layers)
        return logits

    def _bucket(self, b: int) -> int:
        if not self.use_graphs:
            return b
        return min(self.max_slots, 1 << (b - 1).bit_length())

    def _bind(self, bucket: int, view_blocks: int) -> None:
        if self.ssm is not None:
            self.ssm.bind(self.slots[:bucket], self.rows[:bucket])
        if self.kv is not None:
            self.kv.bind(self.rows[:bucket], self.pos[:bucket], view_blocks)

    def _forward(self, bucket: int, ring=None) -> torch.Tensor:
        ctx = DecodeContext(ssm=self.ssm, kv=self.kv, positions=self.pos[:bucket])
        self._keep_tokens(self.rows[:bucket], self.pos[:bucket], self.ids[:bucket])
        if ring is None:
            logits = self.model(self.ids[:bucket], ctx)[:, 0]
        else:  # the drafter's context ring takes this token's target features, as a verify window's commit does
            logits = self._run(self.ids[:bucket], ctx)[:, 0]
            rows = self.rows[:bucket]
            ring.commit_device(rows, self.hidden, self.pos[:bucket], torch.ones_like(rows))
        if self.ssm is not None:
            self.ssm.end_step()
        return logits

    @torch.inference_mode()
    def decode(self, slots: list[int], positions: list[int], tokens: list[int] | torch.Tensor, max_len: int,
               ring=None) -> torch.Tensor:
        """One token per row: row i feeds tokens[i] at positions[i] into slot slots[i]. Returns logits [B, V].
        tokens may be a device tensor [B] (the previous step's sampled tokens, not yet read back): the step
        is then queued without waiting for the host. ring: a device drafter (hidden_layers set) whose context
        ring takes each row's token features inside the step (a speculating engine's plain step)."""
        b = len(slots)
        bucket, view = self._stage(slots, positions, tokens, max_len)
        with blas_for(bucket, self.dtype, self.device):
            if not self.use_graphs:
                out = self._forward(bucket, ring)
            else:
                key = (bucket, view) if ring is None else (bucket, view, getattr(ring, "ring_key", "ring"))
                out = self._replay(key, lambda: self._forward(bucket, ring))
        self._after_step()
        return out[:b]

    def _stage(self, slots, positions, tokens, max_len: int) -> tuple[int, int]:
        """Copy a step's inputs (one token per row, padded to the bucket) into the fixed buffers and bind the
        backends; returns (bucket, KV view)."""
        b = len(slots)
        bucket = self._bucket(b)
        pad = bucket - b
        on_device = isinstance(tokens, torch.Tensor)
        host_toks = [0] * bucket if on_device else list(tokens) + [0] * pad
        # numpy builds the host rows ~3x faster than torch.tensor from lists (46 vs 156 µs at 256 rows on the
        # 2-core dev host); page-locked, so the copy queues behind a step still running
        host = torch.from_numpy(np.array(
            [host_toks, positions + [0] * pad, slots + [-1] * pad, slots + [self.max_slots] * pad], dtype=np.int64))
        self.inputs[:, :bucket].copy_(pinned(host, self.device), non_blocking=True)
        if on_device:
            self.ids[:b, 0].copy_(tokens)
        view = self.kv.view_blocks_for(max_len) if self.kv is not None else 0
        self._bind(bucket, view)
        return bucket, view

    def _replay(self, key: tuple, forward):
        """Replay the graph of `forward` for this key (captured on first use); returns its output buffer."""
        # after bind: binding may change host state that picks the step's code path (kv.graph_key)
        key = (*key, *(self.kv.graph_key() if self.kv is not None else ()))
        if key not in self.graphs:
            self.graphs[key] = self._capture(key[0], forward)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _after_step(self) -> None:
        """The KV policy's per-step read-back (ledger counters), queued right behind the step."""
        if self.kv is not None:
            self.kv.after_step()

    @torch.inference_mode()
    def verify(self, slots: list[int], positions: list[int], windows: list[list[int]] | torch.Tensor, max_len: int
               ) -> torch.Tensor:
        """A window of T tokens per row (row i: windows[i] at positions[i]..+T-1 in slot slots[i]; a device
        tensor [B, T] or host lists); returns logits [B, T, V]. Nothing is committed until `commit`."""
        b = len(slots)
        on_device = isinstance(windows, torch.Tensor)
        host = [] if on_device else [t for w in windows for t in w]
        flat = torch.tensor([*positions, *slots, *slots, *host], dtype=torch.long,
                            device=self.device)  # one host → device copy
        self.inputs[1:, :b] = flat[:3 * b].view(3, b)
        ids = windows if on_device else flat[3 * b:].view(b, len(windows[0]))
        T = ids.shape[1]
        self._bind(b, self.kv.view_blocks_for(max_len) if self.kv is not None else 0)
        if self.ssm is not None:
            self.ssm.begin_window(T)
        self._keep_tokens(self.rows[:b], self.pos[:b], ids)
        with blas_for(b * T, self.dtype, self.device):
            logits = self._run(ids, VerifyContext(ssm=self.ssm, kv=self.kv, positions=self.pos[:b]))
        self._after_step()
        return logits

    @torch.inference_mode()
    def commit(self, accepted: torch.Tensor) -> None:
        """Keep accepted[i] (device tensor, 1..T) window tokens of row i of the last verify."""
        if self.ssm is not None:
            self.ssm.commit(accepted)
        if getattr(self.kv, "commit", None) is not None:  # window rows kept out of the hot buffer until accepted
            self.kv.commit(accepted)

    @torch.inference_mode()
    def speculate(self, drafter, slots: list[int], positions: list[int], anchors: list[int], gamma: int,
                  max_len: int, drafts=None, n_drafts: list[int] | None = None) -> torch.Tensor:
        """One greedy speculative step over a fixed window of 1 + gamma tokens: the drafts come from `drafter`'s
        draft_device (a device drafter: proposes from its context ring inside the step) or, given as
        `drafts` (host lists or a device tensor [b, <= gamma]) with `n_drafts` real ones per row, are staged
        into a fixed buffer (later positions are padding, never accepted). The target verifies [anchor,
        drafts] at positions[i].., the greedy-accepted prefix commits to the SSM backend (cursor) and to a
        device drafter's ring — one CUDA graph per (bucket, view, KV key, gamma, source) when graphs are on.
        Row i's anchor is its last committed token at positions[i]. Returns [b, 3 + gamma] long on the
        device: column 0 the accepted drafts m, then the window's gamma + 1 tokens (the row emits tokens[:m + 1]),
        then the real drafts the row verified. Pages for the whole window must be held (Scheduler.reserve)."""
        b = len(slots)
        staged = drafts is not None
        if staged:
            self._stage_drafts(b, gamma, drafts, n_drafts)
        bucket, view = self._stage(slots, positions, anchors, max_len)
        return self._speculate(drafter, b, bucket, view, gamma, staged)

    @torch.inference_mode()
    def draft(self, drafter, slots: list[int], positions: list[int], anchors: list[int], gamma: int, max_len: int):
        """Greedy drafts [b, gamma] and confidences [b, gamma] of load-aware DSpark for anchors at positions, on the
        device (drafter.draft_confident; one CUDA graph per bucket and gamma with graphs on), for the host to
        choose lengths from before the staged `speculate`."""
        b = len(slots)
        bucket, _ = self._stage(slots, positions, anchors, max_len)
        rows, ids, pos = self.rows[:bucket], self.ids[:bucket, 0], self.pos[:bucket]
        forward = lambda: drafter.draft_confident(rows, ids, pos, gamma)  # noqa: E731
        drafts, conf = forward() if not self.use_graphs else self._replay((bucket, "draft", gamma), forward)
        return drafts[:b], conf[:b]

    @torch.inference_mode()
    def speculate_next(self, drafter, b: int, gamma: int, max_len: int) -> torch.Tensor:
        """The next greedy speculative step over the same b rows as the last `speculate`, queued before that step's
        result is read back: each row's anchor (its last emitted token) and position (+ accepted + 1) come from
        that result on the device; the drafter drafts on the device (draft_device). max_len bounds every row's
        length after the window (the KV view). Pages for it must be held. Returns what `speculate` returns."""
        prev = self._last_spec
        m = prev[:b, 0]
        self.ids[:b, 0].copy_(prev[:b, 1:gamma + 2].gather(1, m[:, None])[:, 0])
        self.pos[:b] += m + 1
        bucket = self._bucket(b)
        view = self.kv.view_blocks_for(max_len) if self.kv is not None else 0
        self._bind(bucket, view)
        return self._speculate(drafter, b, bucket, view, gamma, False)

    def _speculate(self, drafter, b: int, bucket: int, view: int, gamma: int, staged: bool) -> torch.Tensor:
        forward = lambda: self._spec_forward(bucket, drafter, gamma, staged)  # noqa: E731
        key = (bucket, view, "spec", gamma, "staged" if staged else "device")
        with blas_for(bucket * (1 + gamma), self.dtype, self.device):
            out = forward() if not self.use_graphs else self._replay(key, forward)
        self._after_step()
        self._last_spec = out
        return out[:b]

    def _stage_drafts(self, b: int, gamma: int, drafts, n_drafts) -> None:
        """Rows [n_drafts, d_1..d_gamma] of the staged-drafts buffer for this gamma (padding rows: 0 drafts)."""
        buf = self._draft_inputs.get(gamma)
        if buf is None:  # one fixed buffer per gamma: its graphs read it at a fixed address
            buf = self._draft_inputs[gamma] = torch.zeros(self.max_slots, 1 + gamma, dtype=torch.long,
                                                          device=self.device)
        if isinstance(drafts, torch.Tensor):
            g = drafts.shape[1]
            nd = pinned(torch.tensor(n_drafts, dtype=torch.long), self.device).to(self.device, non_blocking=True)
            buf[:b, 0].copy_(nd)
            buf[:b, 1:1 + g].copy_(drafts)
        else:
            rows = np.zeros((b, 1 + gamma), dtype=np.int64)  # numpy: per-row torch.tensor costs ~10 µs a row
            rows[:, 0] = n_drafts
            for i, d in enumerate(drafts):
                rows[i, 1:1 + min(len(d), gamma)] = d[:gamma]
            buf[:b].copy_(pinned(torch.from_numpy(rows), self.device), non_blocking=True)
        buf[b:, 0] = 0

    def _spec_forward(self, bucket: int, drafter, gamma: int, staged: bool) -> torch.Tensor:
        anchors, pos, rows = self.ids[:bucket, 0], self.pos[:bucket], self.rows[:bucket]
        if staged:
            buf = self._draft_inputs[gamma][:bucket]
            n_drafts, drafts = buf[:, 0], buf[:, 1:]
        else:  # padding rows use the drafter's scratch slot
            drafts, n_drafts = drafter.draft_device(rows, anchors, pos, gamma)
        window = torch.cat([anchors[:, None], drafts], 1)
        self._keep_tokens(rows, pos, window)
        if self.ssm is not None:
            self.ssm.begin_window(gamma + 1)
        logits = self._run(window, VerifyContext(ssm=self.ssm, kv=self.kv, positions=pos))
        m, tokens = verify(logits, drafts, None, None, None, None, n_drafts)
        m, tokens = drafter.decide(rows, pos, m, tokens, n_drafts)  # (forced by benchmarks' controlled.py)
        if self.ssm is not None:
            self.ssm.commit(m + 1)
        if getattr(self.kv, "commit", None) is not None:  # window rows kept out of the hot buffer until accepted
            self.kv.commit(m + 1)
        if self.hidden_layers:
            drafter.commit_device(rows, self.hidden, pos, m + 1)
        n = n_drafts if n_drafts is not None else torch.full_like(m, gamma)
        return torch.cat([m[:, None], tokens, n[:, None].to(m.dtype)], 1)

    def _capture(self, bucket: int, forward):
        """Graph of `forward` (a step over `bucket` rows), warmed up and captured with every row as padding
        (slot -1, the scratch row, position 0) so only scratch state and pages are touched: a padding row at
        position 0 takes every KV resolve's no-lookup path (padding rows share one scratch slot). The step's
        inputs are put back afterwards; the backends stay bound to the same buffers, so nothing is bound again
        (a second bind would redo the policy's between-step work)."""
        cuda = self.device.type == "cuda"  # (tests emulate captures on the CPU)
        if cuda:
            torch.cuda.synchronize()  # the step queued before this one is decode time, not capture time
        t0 = time.perf_counter()
        saved = self.inputs[:, :bucket].clone()
        self.ids[:bucket], self.pos[:bucket], self.slots[:bucket], self.rows[:bucket] = 0, 0, -1, self.max_slots
        try:
            return self._record(bucket, forward)
        finally:
            self.inputs[:, :bucket] = saved
            if cuda:
                torch.cuda.synchronize()
            self.capture_s += time.perf_counter() - t0

    def _record(self, bucket: int, forward):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        # join the warm-ups' host backups now: a later wait on the backup event, last recorded inside the
        # capture, would cross the capture boundary
        if self.kv is not None:
            self.kv.quiesce_host()
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        return graph, out
