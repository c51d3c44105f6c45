"""Drafter runtimes: what the Engine calls around each speculative step.

    hidden_layers                     target blocks whose residual stream the drafter consumes (() = none)
    on_prefill(reqs, hidden)          a prefill forward seeded these requests (hidden [n, T, k*H] or None)
    propose(batch, gamma, temperature, generator) -> (drafts, q, n_drafts)
                                      drafts [B, gamma] (device tensor or host lists), q [B, gamma, V] or
                                      None (one-hot), n_drafts: real drafts per row (host list) or None
    on_commit(batch, hidden, start, accepted)
                                      after a verify of the window at positions start[i].. : the first
                                      accepted[i] (device) window tokens were committed; hidden [B, T, k*H]
    step_bytes(batch, lengths)        the drafter's ledger entry for one step (draft_weights_read, draft_kv)
    summary()                         what results.json records about the drafter
The optional hooks (graph_safe, stages_drafts, uses_history, chains, decide) have their defaults on
`Drafter`, which every drafter runtime subclasses; a graph_safe drafter also implements draft_device /
commit_device, and so does one that `chains` (the engine queues its greedy steps back to back); one that
`picks_lengths` (load-aware DSpark) implements draft_confident / lengths. A `gate` (synodic/spec/gate.py) decides
whether a greedy step drafts at all; a neural drafter's closed gate feeds a `deferred` ring from its plain steps.

NgramDrafter (ngram.py) works on host token lists (on the runner's device token history in a step queued behind
the one in flight); NeuralDrafter feeds a DraftModel the target's hidden
states, on the device, from the prefill and verify forwards that already run (no extra pass, no host copy)."""
import torch


class Drafter:
    """The Engine's drafter interface (the module docstring) with the optional hooks' defaults, so the engine
    and runner call them without probing. A subclass implements propose and summary."""
    hidden_layers: tuple[int, ...] = ()
    graph_safe = False     # drafts inside ModelRunner.speculate's graph (draft_device / commit_device)
    stages_drafts = False  # host drafts from propose may fill the captured step's fixed 1 + γ window
    uses_history = False   # looks up the context in the runner's device token history (bind_history)
    picks_lengths = False  # chooses each row's draft count (draft_confident, lengths; the staged window is the longest)
    chains = False         # its draft_device needs nothing from the host: greedy steps may be queued back to back
    gate = None            # a synodic.spec.gate.Gate: whether a greedy step drafts at all (None: every step)
    deferred = None        # a LazyRing: context a closed gate's plain steps buffered (flushed before drafting)
    history = None

    def bind_history(self, history: torch.Tensor) -> None:
        """The runner's token history (ModelRunner.track_history), for a drafter with uses_history."""
        self.history = history

    def on_prefill(self, reqs, hidden) -> None:
        pass

    def propose(self, batch, gamma, temperature, generator):
        raise NotImplementedError

    def on_commit(self, batch, hidden, start, accepted) -> None:
        pass

    def draft_device(self, slots, anchors, positions, gamma: int):
        """Inside the captured step: (drafts [B, gamma] long, real drafts per row [B] or None = all gamma)."""
        raise NotImplementedError

    def decide(self, slots, positions, m, tokens, n_drafts=None):
        """The verify's (accepted [B], tokens [B, G+1]) on the device, as the step commits them: the verify's
        own decision unless a benchmark wrapper forces it (synodic/spec/controlled.py)."""
        return m, tokens

    def step_bytes(self, batch, lengths) -> dict[str, int]:
        return {}

    def discard_step(self) -> None:
        """The latest step's rows had all ended before it (it was queued behind the step they ended in)."""

    def summary(self) -> dict:
        raise NotImplementedError


class SyntheticDrafter(Drafter):
    """Drafts from a callable (requests → γ tokens each), for tests that force chosen acceptances."""

    def __init__(self, fn):
        self.fn = fn

    def propose(self, batch, gamma, temperature, generator):
        return self.fn(batch), None, None

    def summary(self) -> dict:
        return {"scheme": "synthetic"}


_UNBUILT = object()  # NeuralDrafter's gate before its first use


class NeuralDrafter(Drafter):
    """Drives a synodic.spec.models.DraftModel: its context ring takes the committed tokens' target
    features, propose() drafts a block from the last committed token (the anchor)."""

    def __init__(self, model, cfg, device):
        from synodic.graph import linear_weight_bytes
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self.hidden_layers = tuple(model.target_layers)
        self.gamma = cfg.num_speculative_tokens
        self.lookup_hint = getattr(getattr(model, "config", None), "lookup_hint", 0)
        self.uses_history = bool(self.lookup_hint)  # the hints: prompt lookup over the runner's token history
        self.sps = None  # an SpsProfile: DSpark's load-aware verify lengths (set by spec=dspark verify=load_aware)
        self._gate, self._gate_sps = None, _UNBUILT  # (the gate property builds it)
        self.deferred = None  # the deferred ring feed of a closed gate's plain steps (lazy_ring)
        self._wbytes: dict[int, int] = {}
        self._linear_weight_bytes = linear_weight_bytes
        self.kv_row_bytes = _ring_row_bytes(model, cfg.context_window)

    @torch.inference_mode()
    def on_prefill(self, reqs, hidden) -> None:
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.long, device=self.device)
        T = hidden.shape[1]
        self.model.reset(slots)
        if self.deferred is not None:
            self.deferred.pos.index_fill_(0, slots, -1)
        pos = torch.arange(T, device=self.device).expand(len(reqs), T)
        self.model.append_context(slots, hidden, pos, torch.ones(len(reqs), T, dtype=torch.bool, device=self.device))

    @torch.inference_mode()
    def propose(self, batch, gamma, temperature, generator):
        host = torch.tensor([[r.slot for r in batch], [r.output_ids[-1] for r in batch],
                             [r.length - 1 for r in batch]], dtype=torch.long)
        slots, anchors, pos = host.to(self.device, non_blocking=True)
        drafts, q = self.model.propose(slots, anchors, pos, gamma, temperature, generator,
                                       **self._hints(slots, anchors, pos, gamma))
        if self.sps is None:
            return drafts, q, None
        return drafts, q, self.lengths(self.model.last_confidence)

    def lengths(self, confidence: torch.Tensor) -> list[int]:
        """DSpark load-aware verify: per-row draft counts from the calibrated confidences [B, γ] (one host read)."""
        from synodic.spec.load_aware import choose_lengths
        n, _ = choose_lengths(confidence.float().cpu().numpy(), self.sps)
        return n.tolist()

    def draft_confident(self, slots, anchors, positions, gamma: int):
        """Greedy drafts [B, gamma] and their calibrated confidences [B, gamma] (load-aware DSpark), on the device:
        ModelRunner.draft captures it."""
        drafts, _ = self.model.propose(slots, anchors, positions, gamma, None, None, confidence=True,
                                       **self._hints(slots, anchors, positions, gamma))
        return drafts, self.model.last_confidence

    @torch.inference_mode()
    def on_commit(self, batch, hidden, start, accepted) -> None:
        slots = torch.tensor([r.slot for r in batch], dtype=torch.long).to(hidden.device, non_blocking=True)
        self.commit_device(slots, hidden, start, accepted)

    # -- the captured step's halves (ModelRunner.speculate): device tensors in, nothing read back ---------------
    def _hints(self, slots, anchors, positions, gamma: int) -> dict:
        """The block's lookup hints (prompt lookup over the runner's device token history, as spec=ngram
        proposes), as propose's keyword; {} for a drafter trained without them."""
        if not self.lookup_hint:
            return {}
        from .models.lookup import history_hints
        return {"hints": history_hints(self.history, slots, anchors, positions, gamma, self.lookup_hint)}

    @property
    def graph_safe(self) -> bool:
        """Whether a greedy step of this drafter can run as ModelRunner.speculate's one graph (a drafter that
        picks per-row draft counts on the host — load-aware verify — cannot)."""
        return self.sps is None

    stages_drafts = True  # (load-aware verify stages a window of its longest chosen length)

    @property
    def gate(self):
        """Whether a greedy step drafts (synodic/spec/gate.py): load-aware DSpark's DraftGate when its SPS profile
        prices plain and draft steps, else a MeasuredGate; None with spec.gate=off. Built on first use and again
        when the profile is replaced; kept across generate() calls. (The engine asks at every step.)"""
        if self._gate_sps is not self.sps:
            self.gate = self._make_gate()
        return self._gate

    @gate.setter
    def gate(self, gate) -> None:
        self._gate, self._gate_sps = gate, self.sps

    def _make_gate(self):
        if self.cfg.gate == "off":
            return None
        if self.sps is not None and self.sps.gates:
            from synodic.spec.load_aware import DraftGate
            return DraftGate(self.sps, max_wait=self.cfg.gate_max_wait, feed=self.cfg.gate_feed)
        from synodic.spec.gate import MeasuredGate
        return MeasuredGate(max_wait=self.cfg.gate_max_wait, feed=self.cfg.gate_feed)

    @property
    def picks_lengths(self) -> bool:
        return self.sps is not None

    @property
    def chains(self) -> bool:
        return self.graph_safe

    def draft_device(self, slots, anchors, positions, gamma: int):
        """Greedy drafts [B, gamma] from the ring rows of `slots` (the scratch slot for padding rows)."""
        drafts, _ = self.model.propose(slots, anchors, positions, gamma, None, None,  # None: all greedy
                                       **self._hints(slots, anchors, positions, gamma))
        return drafts, None

    def commit_device(self, slots, hidden, start, accepted) -> None:
        """The ring takes the first accepted[i] (device) window tokens' features at positions start[i].."""
        T = hidden.shape[1]
        t = torch.arange(T, device=hidden.device)
        self.model.append_context(slots, hidden, start[:, None] + t, t[None, :] < accepted[:, None])

    def step_bytes(self, batch, lengths) -> dict[str, int]:
        """One propose over B rows: the drafter's linears at B * (γ + 1) rows (its bound LM head included) and
        each row's context ring rows (min(length, context_window) of them, every draft layer's K and V)."""
        rows = len(batch) * (self.gamma + 1)
        if rows not in self._wbytes:  # the bound target LM head is the drafter's too (not among its modules)
            head = getattr(self.model, "_target", None)
            self._wbytes[rows] = self._linear_weight_bytes(self.model, rows) + (
                self._linear_weight_bytes(head[1], rows) if head is not None else 0)
        ctx = sum(min(n, self.cfg.context_window) for n in lengths)
        return {"draft_weights_read": self._wbytes[rows], "draft_kv": ctx * self.kv_row_bytes}

    def summary(self) -> dict:
        return {"scheme": self.model.scheme, "drafter": self.cfg.drafter,
                "verify": "load_aware" if self.sps is not None else "fixed", **self._gate_summary(),
                "target_layers": list(self.hidden_layers),
                "trained_gamma": self.model.gamma, "context_window": self.cfg.context_window,
                "parameters": sum(p.numel() for p in self.model.parameters())}

    def lazy_ring(self, max_slots: int) -> "LazyRing":
        """What a closed gate's plain steps feed instead of the context ring (allocated on first use)."""
        if self.deferred is None:
            r = self.model._ring
            # the plain loop checks the gate before reading the step in flight back: up to max_wait + 1 plain steps
            # run between two drafting steps, of which at most feed + 1 feed (Gate.feeds)
            g = self.gate
            rows = min(g.max_wait + 1, g.feed + 1, r["window"])
            self.deferred = LazyRing(self.model, max_slots, rows, r["kv"].dtype, self.device)
        return self.deferred

    def _gate_summary(self) -> dict:
        g = self.gate
        return {} if g is None else {"gate": g.summary()}


class LazyRing:
    """The context ring's feed of plain steps, deferred while a neural drafter's gate is closed: each fed step
    keeps its tokens' fused features (the drafter's fc + norm, one small GEMM) in a per-slot buffer of `rows`
    positions instead of running every draft layer's K / V projection, and `flush` appends them to the ring in one
    batch before the next drafting step. The ring then holds what eager feeding of those steps would have written:
    the gate drafts at least every max_wait + 1 plain steps, of which at most feed + 1 feed, and rows = min(max_wait
    + 1, feed + 1, the ring's window), so nothing fed that the ring would still hold is overwritten in the buffer,
    and a buffered position never replaces a newer one in it."""
    ring_key = "lazy-ring"  # (ModelRunner.decode captures a graph per ring kind)

    def __init__(self, model, max_slots: int, rows: int, dtype, device):
        self.model, self.rows = model, rows
        self.ctx = torch.zeros(max_slots + 1, rows, model.config.hidden_size, dtype=dtype, device=device)
        self.pos = torch.full((max_slots + 1, rows), -1, dtype=torch.long, device=device)
        self.pending = False  # set by the engine when it queues plain steps that feed it (a replayed graph runs
        # commit_device's kernels, not its Python)

    def commit_device(self, slots, hidden, start, accepted) -> None:
        """ModelRunner's ring call for a one-token step: row i's token at start[i] (accepted[i] = 1)."""
        idx = (start % self.rows)[:, None]
        self.ctx[slots[:, None], idx] = self.model.fuse(hidden).to(self.ctx.dtype)
        self.pos[slots[:, None], idx] = torch.where(accepted > 0, start, -1)[:, None]

    @torch.inference_mode()
    def flush(self, slots: torch.Tensor) -> None:
        """Append the buffered positions of `slots` to the context ring (the newer wins where both hold one)."""
        pos = self.pos[slots]
        W = self.model._ring["window"]
        held = self.model._ring["pos"][slots[:, None], pos.clamp(min=0) % W]
        self.model.append_fused(slots, self.ctx[slots], pos.clamp(min=0), (pos >= 0) & (pos > held))
        self.pos.index_fill_(0, slots, -1)


def _ring_row_bytes(model, window: int) -> int:
    """Bytes of one context position across the drafter's ring buffers (what attention over one context row
    reads): every draft layer's K and V row in the allocated ring."""
    ring = getattr(model, "_ring", None)  # {"k": [per layer [slots, W + 1, heads, dim]], "v": [...], ...}
    if ring is None:
        return 0
    return sum(t[0, 0].numel() * t.element_size() for t in [*ring["k"], *ring["v"]])
