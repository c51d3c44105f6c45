"""Lossless verification of a block of drafts against the target, vectorised on the device.

Row r verifies drafts d_1..d_G (the window [anchor, d_1..d_G] gave target logits at G + 1 positions).
Greedy rows (temperature 0) accept while d_k equals the target's argmax and then emit the argmax, so the
output equals plain greedy decoding token for token. Sampling rows accept d_k with probability
min(1, p_k(d_k) / q_k(d_k)) left to right; at the first rejection they emit a sample of
norm(max(0, p_k - q_k)); when every draft passes, a bonus sample of p_{G+1}. The emitted tokens are then
distributed exactly as target sampling (the speculative-sampling theorem). Drafters without a q (n-gram,
greedy drafts) count as one-hot q. The randomness is an explicit uniform per draft plus one for the final
sample, drawn by the caller from each request's own generator, so a seeded request's tokens do not depend
on its batch. `verify_reference` is the same rule as a plain per-row loop."""
import torch


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] → the distribution the target samples from, float32 [B, T, V]: softmax(logits / t)
    restricted to the top-p nucleus (the smallest prefix of mass >= top_p, as synodic.engine.sampler) and
    renormalised; greedy rows (t = 0) one-hot at the argmax."""
    t = temperature.float().clamp(min=1e-6)[:, None, None]
    p = torch.softmax(logits.float() / t, -1)
    sp, idx = p.sort(-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p.float()[:, None, None]
    p = torch.zeros_like(p).scatter_(-1, idx, sp * keep)
    p = p / p.sum(-1, keepdim=True)
    greedy = torch.zeros_like(p).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where((temperature == 0)[:, None, None], greedy, p)


def _inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One sample per row of the (unnormalised) dist [B, V] from the uniforms u [B] in [0, 1)."""
    c = dist.cumsum(-1)
    # side='right': the first index whose cumulative mass exceeds u * total, so zero-mass entries never win
    idx = torch.searchsorted(c, (u * c[:, -1]).unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    return idx.clamp(max=dist.shape[-1] - 1)


def verify(logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, temperature: torch.Tensor,
           top_p: torch.Tensor, uniforms: torch.Tensor | None, n_drafts: torch.Tensor | None = None,
           residual: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, G+1, V] of the window, drafts [B, G] long, q [B, G, V] (the distributions the drafts were
    sampled from) or None (one-hot), temperature / top_p [B], uniforms [B, G+1] (None: every row greedy),
    n_drafts [B] real drafts per row (later ones are padding, never accepted; None: all G).
    Returns (accepted [B] long: drafts kept, tokens [B, G+1] long: the row emits tokens[:accepted + 1]).
    residual=False replaces the rejection sample by a plain target sample (wrong; tests prove it matters)."""
    B, T, _ = logits.shape
    G = T - 1
    pos = torch.arange(G, device=logits.device)
    real = pos[None, :] < (n_drafts[:, None] if n_drafts is not None else G)
    if uniforms is None:  # all greedy: integer comparisons only, no softmax
        target = logits.argmax(-1)
        ok = (drafts == target[:, :G]) & real
        m = ok.int().cumprod(-1).sum(-1)
        return m, torch.cat([drafts, target[:, G:]], 1).scatter(1, m[:, None], target.gather(1, m[:, None]))
    p = target_probs(logits, temperature, top_p)
    pd = p[:, :G].gather(-1, drafts[..., None]).squeeze(-1)
    qd = torch.ones_like(pd) if q is None else q.float().gather(-1, drafts[..., None]).squeeze(-1)
    ok = (uniforms[:, :G] * qd < pd) & real  # u < p/q without dividing; p = 0 never passes
    m = ok.int().cumprod(-1).sum(-1)
    pm = p.gather(1, m[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)
    if q is None:
        qm = torch.zeros_like(pm).scatter_(-1, drafts.gather(1, m.clamp(max=G - 1)[:, None]), 1.0) if G else pm * 0
    else:
        qm = q.float().gather(1, m.clamp(max=max(G - 1, 0))[:, None, None].expand(-1, 1, q.shape[-1])).squeeze(1)
    rejected = (m < n_drafts) if n_drafts is not None else (m < G)
    dist = (pm - qm).clamp(min=0) if residual else pm
    dist = torch.where(rejected[:, None], dist, pm)  # all passed (or ran out of real drafts): bonus from p
    dist = torch.where(dist.sum(-1, keepdim=True) > 0, dist, pm)  # p == q at the rejection (measure zero)
    last = _inverse_cdf(dist, uniforms[:, G])
    last = torch.where(temperature == 0, logits.argmax(-1).gather(1, m[:, None]).squeeze(1), last)
    tokens = torch.cat([drafts, m[:, None] * 0], 1).scatter(1, m[:, None], last[:, None])
    return m, tokens


def verify_reference(logits, drafts, q, temperature, top_p, uniforms, n_drafts=None):
    """The same rule, one row and one draft at a time in plain torch (the reference the tests compare)."""
    B, T, V = logits.shape
    G = T - 1
    acc, out = [], []
    for r in range(B):
        t = 0.0 if temperature is None else float(temperature[r])
        nd = G if n_drafts is None else int(n_drafts[r])

        toks, k = [], 0
        while True:
            pk = _ref_probs(logits[r, k], t, float(top_p[r]) if top_p is not None else 1.0)
            if k == nd:  # every real draft passed: bonus
                toks.append(_draw(pk, uniforms, r, G, t, logits[r, k]))
                break
            d = int(drafts[r, k])
            qk = torch.nn.functional.one_hot(torch.tensor(d), V).float() if q is None else q[r, k].float()
            u = 0.0 if uniforms is None else float(uniforms[r, k])
            if u * float(qk[d]) < float(pk[d]):
                toks.append(d)
                k += 1
                continue
            res = (pk - qk).clamp(min=0)
            toks.append(_draw(res if res.sum() > 0 else pk, uniforms, r, G, t, logits[r, k]))
            break
        acc.append(len(toks) - 1)
        out.append(toks)
    return acc, out


def _ref_probs(logit_row, t: float, top_p: float) -> torch.Tensor:
    V = logit_row.numel()
    if t == 0:
        return torch.nn.functional.one_hot(logit_row.argmax(), V).float()
    pr = torch.softmax(logit_row.float() / t, -1)
    mass, keep = 0.0, torch.zeros(V, dtype=torch.bool)
    for i in pr.argsort(descending=True).tolist():  # the smallest prefix of mass >= top_p
        if mass >= top_p:
            break
        keep[i], mass = True, mass + float(pr[i])
    pr = pr * keep
    return pr / pr.sum()


def _draw(dist, uniforms, r, G, t, logit_row):
    if t == 0:
        return int(logit_row.argmax())
    c = dist.cumsum(0)
    u = float(uniforms[r, G]) * float(c[-1])
    return min(int((c <= u).sum()), dist.numel() - 1)
