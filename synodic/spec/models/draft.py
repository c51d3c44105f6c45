"""DraftModel: the DFlash block-diffusion backbone (+ DSpark's or DFlash2's heads), its per-slot context ring and
the propose step.

Block convention (DFlash proper with block γ+1): the block is [anchor, MASK x γ] at positions p..p+γ, anchor = the
last committed token at p (its target features are not known yet); block row k (1..γ) predicts the token at p+k.
Context = the committed tokens' target features at positions < p (within the last `context_window`), fused by
fc (n*H -> H, no bias) + RMSNorm; every layer projects it with its own k/v (QK-normed, RoPE at the rows' absolute
positions) and prepends those rows to the block's own K/V. Queries come from the block only; the block attends
to itself bidirectionally."""
import torch
from torch import nn

from .config import DraftConfig
from .heads import ConfidenceHead, MarkovHead, PathSelector, sample
from .layers import DraftLayer, RMSNorm, block_starts, rope_cos_sin, tap_masks


class DraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        self.scheme = cfg.scheme
        self.target_layers = tuple(cfg.target_layers)
        self.gamma = cfg.gamma
        H = cfg.hidden_size
        self.fc = nn.Linear(len(self.target_layers) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        if cfg.lookup_hint:  # added to a mask slot's input with the hint token's (target) embedding
            self.hint_embedding = nn.Parameter(torch.zeros(H))
        self.layers = nn.ModuleList(DraftLayer(cfg, conv=cfg.scheme == "dflash2") for _ in range(cfg.num_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        if cfg.scheme == "dspark":
            self.markov = MarkovHead(cfg.vocab_size, cfg.markov_rank)
            self.confidence = ConfidenceHead(H, cfg.markov_rank, cfg.gamma)
        if cfg.scheme == "dflash2":
            self.selector = PathSelector(cfg.vocab_size, H, cfg.selector_rank, cfg.selector_k)
        self._target = None          # (embedding, lm_head) of the bound target: shared, frozen, not saved
        self._ring = None
        self.last_confidence = None  # DSpark: [B, gamma] calibrated confidences of the last propose

    # -- target binding ------------------------------------------------------------------------------------------
    def bind_target(self, target) -> "DraftModel":
        """Share the target's embedding and LM head (a HybridLM); they stay out of this module's parameters."""
        cfg = target.config
        if cfg.vocab_size != self.config.vocab_size or cfg.hidden_size != self.config.hidden_size:
            raise ValueError(f"bind_target: drafter has vocab {self.config.vocab_size} / hidden "
                             f"{self.config.hidden_size}, target {cfg.vocab_size} / {cfg.hidden_size}")
        object.__setattr__(self, "_target", (target.embed_tokens, target.lm_head))
        return self

    def _dtype(self):
        return self.fc.weight.dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._target[0](ids).to(self._dtype())

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Target LM head of final-normed rows → fp32 logits."""
        lm = self._target[1]
        return lm(h.to(lm.weight.dtype)).float()

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(hidden.to(self._dtype())))

    # -- backbone ------------------------------------------------------------------------------------------------
    def run_layers(self, x, pos, first, ctx_kv, mask) -> torch.Tensor:
        """x [B, N, H] block rows at positions pos [B, N]; ctx_kv per layer (k, v) [B, M, nkv, d]; mask
        [B, N, M + N]. Returns the final-normed rows."""
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        start = inside = None
        if self.scheme == "dflash2":  # once per forward for every convolution (8 a forward)
            start = block_starts(first)
            if torch.is_grad_enabled():  # the torch form's masks (the fused inference kernel reads start)
                inside = tap_masks(first, self.config.conv_taps, start)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask, first, inside, start)
        return self.norm(x)

    def context_kv(self, ctx: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta, ctx.dtype)
        return [layer.attn.kv(ctx, cos, sin) for layer in self.layers]

    def block_inputs(self, anchors: torch.Tensor, gamma: int, hints: torch.Tensor | None = None) -> torch.Tensor:
        """[..., gamma + 1, H]: the anchor's embedding then gamma mask embeddings; with lookup hints [..., gamma]
        (-1 = none) a hinted slot adds the hint token's embedding and hint_embedding."""
        e = self.embed(anchors)[..., None, :]
        m = self.mask_embedding.to(e.dtype).expand(*anchors.shape, gamma, e.shape[-1])
        if self.config.lookup_hint:
            if hints is None:
                raise ValueError("block_inputs: this drafter takes lookup hints (config.lookup_hint > 0)")
            have = (hints >= 0)[..., None]
            m = m + torch.where(have, self.embed(hints.clamp(min=0)) + self.hint_embedding.to(e.dtype), 0.0)
        return torch.cat([e, m], dim=-2)

    def hints_for(self, tokens: torch.Tensor, anchor_pos: torch.Tensor, gamma: int) -> torch.Tensor | None:
        """Lookup hints of blocks at anchor_pos [B, A] over tokens [B, T] (None when the drafter takes none)."""
        if not self.config.lookup_hint:
            return None
        from .lookup import lookup_hints
        return lookup_hints(tokens, anchor_pos, gamma, self.config.lookup_hint)

    def train_blocks(self, hidden: torch.Tensor, tokens: torch.Tensor, anchor_pos: torch.Tensor,
                     gamma: int | None = None, window: int | None = None) -> torch.Tensor:
        """Many blocks per sequence in one forward (training / teacher-forced evaluation). hidden [B, T, n*H]
        target features of tokens [B, T]; anchor_pos [B, A] (>= 1, distinct or not). Block a sees context rows
        j with anchor - window <= j < anchor, itself bidirectionally, no other block. Returns the final-normed
        block rows 1..gamma [B, A, gamma, H]."""
        g = gamma or self.gamma
        B, T, _ = hidden.shape
        A = anchor_pos.shape[1]
        dev = hidden.device
        cpos = torch.arange(T, device=dev).expand(B, T)
        ctx_kv = self.context_kv(self.fuse(hidden), cpos)
        x = self.block_inputs(tokens.gather(1, anchor_pos), g, self.hints_for(tokens, anchor_pos, g))
        x = x.reshape(B, A * (g + 1), -1)
        off = torch.arange(g + 1, device=dev)
        pos = (anchor_pos[:, :, None] + off).reshape(B, -1)
        first = (off == 0).expand(B, A, g + 1).reshape(B, -1)
        mask = block_mask(anchor_pos, g, T, window)
        h = self.run_layers(x, pos, first, ctx_kv, mask)
        return h.view(B, A, g + 1, -1)[:, :, 1:]

    # -- scheme logits (teacher-forced, for training) ------------------------------------------------------------
    def train_logits(self, h: torch.Tensor, prev: torch.Tensor) -> dict[str, torch.Tensor]:
        """h [..., H] block rows, prev [...] the true token before each row's target. 'draft' is the logits the
        drafter samples from; 'base' the backbone's U; 'conf' (DSpark) the confidence logit."""
        U = self.head(h)
        out = {"base": U}
        if self.scheme == "dflash":
            out["draft"] = U
        elif self.scheme == "dspark":
            out["draft"] = U + self.markov(prev).float()
            out["conf"] = self.confidence.logit(h, self.markov.W1(prev))
        else:
            out["draft"] = self.selector.full_scores(prev, h, U)
        return out

    # -- inference: context ring + propose -----------------------------------------------------------------------
    def allocate(self, max_slots: int, context_window: int, device, dtype) -> None:
        """Per slot and layer a ring of `context_window` rotated context K/V rows (+1 scratch row that takes the
        writes of invalid rows) and the position each row holds (-1 = empty). Slot max_slots is the scratch
        slot of a captured step's padding rows."""
        c = self.config
        W = context_window
        # one tensor [layers, k/v, slots, rows, heads, dim]: a step gathers and appends every layer's K and V in
        # one index op each way; "k" / "v" are its per-layer views
        kv = torch.zeros(len(self.layers), 2, max_slots + 1, W + 1, c.num_kv_heads, c.head_dim, device=device,
                         dtype=dtype)
        self._ring = {
            "window": W,
            "kv": kv,
            "k": [kv[i, 0] for i in range(len(self.layers))],
            "v": [kv[i, 1] for i in range(len(self.layers))],
            "pos": torch.full((max_slots + 1, W + 1), -1, device=device, dtype=torch.long),
        }

    def reset(self, slots: torch.Tensor) -> None:
        self._ring["pos"].index_fill_(0, slots, -1)

    @torch.no_grad()
    def append_context(self, slots, hidden, positions, valid) -> None:
        """hidden [B, t, n*H] features of committed tokens at positions [B, t]; rows with valid False write to the
        scratch row. A row at position p lands at ring index p % window (t <= window)."""
        self.append_fused(slots, self.fuse(hidden).to(self._ring["kv"].dtype), positions, valid)

    @torch.no_grad()
    def append_fused(self, slots, ctx, positions, valid) -> None:
        """append_context after the fusion: ctx [B, t, H] = fuse(hidden) in the ring's dtype."""
        r = self._ring
        W = r["window"]
        dtype = r["kv"].dtype
        idx = torch.where(valid, positions % W, W)
        s = slots[:, None].expand_as(idx)
        rows = torch.stack([t for kv in self.context_kv(ctx, positions) for t in kv])  # [2 * layers, B, t, ...]
        r["kv"][:, :, s, idx] = rows.view(len(self.layers), 2, *rows.shape[1:]).to(dtype)
        r["pos"][s, idx] = torch.where(valid, positions, -1)

    @torch.no_grad()
    def propose(self, slots, anchors, positions, gamma: int, temperature, generator=None, hints=None,
                confidence: bool = False):
        """anchors [B] at positions [B] → drafts [B, gamma] long, q [B, gamma, V] fp32 (the distribution each
        draft was drawn from; one-hot for temperature-0 rows). DSpark also sets last_confidence [B, gamma].
        hints [B, gamma] (device, -1 = none): the lookup hints when config.lookup_hint > 0. temperature None:
        every row greedy, q None (see decode)."""
        if gamma > self.gamma:
            raise ValueError(f"propose: gamma={gamma} exceeds the {self.gamma} drafts this drafter was trained for")
        r = self._ring
        W = r["window"]
        B = anchors.shape[0]
        x = self.block_inputs(anchors, gamma, hints).to(r["kv"].dtype)
        off = torch.arange(gamma + 1, device=anchors.device)
        pos = positions[:, None] + off
        first = (off == 0).expand(B, gamma + 1)
        rp = r["pos"][slots]
        p = positions[:, None]
        ctx_ok = (rp >= 0) & (rp < p) & (rp >= p - W)
        mask = torch.cat([ctx_ok[:, None].expand(B, gamma + 1, W + 1),
                          torch.ones(B, gamma + 1, gamma + 1, dtype=torch.bool, device=anchors.device)], dim=-1)
        ctx = r["kv"][:, :, slots]  # every layer's context K and V rows in one gather
        ctx_kv = [(ctx[i, 0], ctx[i, 1]) for i in range(len(self.layers))]
        h = self.run_layers(x, pos, first, ctx_kv, mask)[:, 1:]
        return self.decode(h, anchors, temperature, generator, confidence)

    def decode(self, h: torch.Tensor, anchors: torch.Tensor, temperature, generator=None, confidence: bool = False):
        """Drafts and q from block rows h [B, g, H] (left to right for the schemes whose q depends on the
        previous draft). temperature None: every row greedy, q None and no DSpark confidences (unless
        `confidence`: load-aware verify's greedy drafts) — the drafts of temperature 0 without the
        full-vocabulary softmax, noise and one-hot q per position that a greedy caller (the captured step,
        teacher-forced scoring) throws away."""
        U = self.head(h)
        g = h.shape[1]
        greedy = temperature is None
        if self.scheme == "dflash":
            self.last_confidence = None
            return (U.argmax(-1), None) if greedy else sample(U, temperature, generator)
        if self.scheme == "dflash2":
            return self._walk_paths(U, h, anchors, temperature, generator)
        drafts, qs = [], []
        prev = anchors
        for k in range(g):  # DSpark: each position's Markov correction needs the previous draft
            logits = U[:, k] + self.markov(prev).float()
            if greedy:
                tok = logits.argmax(-1)
            else:
                tok, q = sample(logits, temperature, generator)
                qs.append(q)
            drafts.append(tok)
            prev = tok
        drafts = torch.stack(drafts, 1)
        self.last_confidence = None
        if confidence or not greedy:  # every position's confidence at once: its previous token is known now
            prevs = torch.cat([anchors[:, None], drafts[:, :-1]], 1)
            z = self.confidence.logit(h, self.markov.W1(prevs)).float()
            self.last_confidence = torch.sigmoid(z / self.confidence.temperature[:g])
        return drafts, (None if greedy else torch.stack(qs, 1))

    def _walk_paths(self, U: torch.Tensor, h: torch.Tensor, anchors: torch.Tensor, temperature, generator=None):
        """DFlash2's drafts: a left-to-right walk over each position's top-K of U, scored by the path selector's
        table (PathSelector.path_table). Greedy: the best next candidate after every previous one is one argmax
        over the table, and the walk is g index lookups; sampled: each position draws from its table row, q is
        that draw's distribution over the top-K (zero elsewhere). A temperature-0 row of a sampled call takes the
        argmax of the same row, so its drafts equal the greedy call's bit for bit."""
        self.last_confidence = None
        B, g = U.shape[:2]
        cand = U.topk(min(self.selector.k, U.shape[-1]), dim=-1).indices  # [B, g, K]
        S = self.selector.path_table(anchors, h, U.gather(-1, cand), cand)
        K = cand.shape[-1]
        if temperature is None:
            best = S.argmax(-1)  # [B, g, K]: the best candidate at t after candidate i at t - 1
            picks = [best[:, 0, 0]]
            for t in range(1, g):
                picks.append(best[:, t].gather(1, picks[-1][:, None])[:, 0])
            return cand.gather(2, torch.stack(picks, 1)[..., None])[..., 0], None
        j, picks, qs = torch.zeros(B, dtype=torch.long, device=U.device), [], []
        for t in range(g):
            j, qk = sample(S[:, t].gather(1, j[:, None, None].expand(B, 1, K))[:, 0], temperature, generator)
            qs.append(torch.zeros_like(U[:, t], dtype=qk.dtype).scatter_(1, cand[:, t], qk))
            picks.append(j)
        return cand.gather(2, torch.stack(picks, 1)[..., None])[..., 0], torch.stack(qs, 1)


def block_mask(anchor_pos: torch.Tensor, gamma: int, T: int, window: int | None) -> torch.Tensor:
    """[B, A*(g+1), T + A*(g+1)] bool: block a's rows see context j in [anchor - window, anchor) and the rows of
    block a; nothing else."""
    B, A = anchor_pos.shape
    dev = anchor_pos.device
    n = gamma + 1
    ap = anchor_pos.repeat_interleave(n, dim=1)[:, :, None]      # [B, N, 1]
    j = torch.arange(T, device=dev)
    ctx = j < ap
    if window is not None:
        ctx = ctx & (j >= ap - window)
    blk = torch.arange(A, device=dev).repeat_interleave(n)
    own = (blk[:, None] == blk[None, :]).expand(B, -1, -1)
    return torch.cat([ctx, own], dim=-1)
