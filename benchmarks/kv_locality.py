"""How much consecutive decode steps' top-k selections overlap, and what an LRU hot buffer would fetch.

    python -m benchmarks.kv_locality --out locality.json [--tokens 2048] [--steps 64] [--top-k 256]

Why: a hot buffer (hisparse's B slots per request and layer, adaptive's larger working set) saves host fetches
only when step t selects rows that steps t-1, t-2, ... also selected. The issue's reference point (hisparse with
B = 2k fetching ~10-15 % of selected rows) assumes a trained model's locality. `bench_long` runs random-weight
`dsa_mla_7b`, where hisparse fetches 75 % = 1 - B / context: no locality at all. This tool measures the property
on CPU-sized models, teacher-forced over the shipped held-out text:

- `learned`: the layer's DSA lightning indexer (`LightningIndexer.scores`), as `kv.indexer=learned` selects;
- `attention`: the layer's own attention probabilities summed over heads (what a perfect indexer would rank by);
- `distilled` (`--distill-steps N`, trained models): a fresh lightning indexer per attention layer trained for N
  Adam steps as DSA's warm-up trains it — KL from the layer's head-summed attention distribution to the softmax of
  the index scores, the model frozen — on held-out windows that come after the measured one; `fresh` is the same
  seeded indexer untrained (a random indexer on a trained model).

For the last `steps` positions t of the window it takes each attention layer's top-k of positions [0, t] and
reports, per model x scorer x layer, the mean overlap |S_t ∩ S_(t-1)| / k and the share of selected rows an LRU
buffer of B = `buffer` x k rows (seeded with the first step's selection, the newest token always present) would
have to fetch. Random-weight and trained models side by side separate the workload's locality from the policy's.
Writes JSON and prints a markdown table. `--save-distilled DIR` (with `--distill-steps`) also writes the trained
tiny_mamba2 with its distilled indexers as a checkpoint: `model.kind=tiny_mamba2 model.weights=DIR kv=hisparse`
(or adaptive) then serves it, selecting with those indexers — a workload with a trained indexer's locality.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import OrderedDict

import torch

from benchmarks._cli import out_file

# (label, preset, weights): trained checkpoints where the project ships them, random inits of the same shapes
MODELS = [("tiny_mamba2 trained", "tiny_mamba2", "auto"), ("tiny_gdn trained", "tiny_gdn", "auto"),
          ("tiny_mamba2 random", "tiny_mamba2", "random"), ("tiny_dsa random", "tiny_dsa", "random")]


def layer_inputs(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Teacher-forced forward of ids [T]: every attention layer's input hidden state [T, hidden], by layer index."""
    from synodic.models.attention import Attention
    got: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, i=i: got.__setitem__(i, args[0][0].detach()))
             for i, m in enumerate(a for a in model.modules() if isinstance(a, Attention))]
    try:
        with torch.no_grad():
            model(ids[None])
    finally:
        for h in hooks:
            h.remove()
    return got


def attention_scores(attn, h: torch.Tensor, t0: int) -> torch.Tensor:
    """Rows t0..T-1: the layer's causal attention probabilities summed over query heads, [T - t0, T]."""
    T = h.shape[0]
    pos = torch.arange(T)
    q, k, _ = attn._qkv(h[None], pos)
    q, k = q[0].float(), k[0].float()                                   # [T, nq, hd], [T, nkv, hd]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = torch.einsum("thd,shd->hts", q[t0:], k) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(pos[None, t0:, None] < pos[None, None, :], float("-inf"))
    return logits.softmax(-1).sum(0)


def indexer_scores(indexer, h: torch.Tensor, t0: int) -> torch.Tensor:
    """Rows t0..T-1: a lightning indexer's scores over all positions (future ones masked to -inf)."""
    T = h.shape[0]
    pos = torch.arange(T)
    out = indexer(h, pos)
    s = type(indexer).scores(out.q[t0:], out.w[t0:], out.k)
    return s.masked_fill(pos[t0:, None] < pos[None, :], float("-inf"))


def distill_indexers(model, ids: torch.Tensor, steps: int, window: int = 512, lr: float = 3e-3, seed: int = 0,
                     n_heads: int = 4, head_dim: int = 32, rope_dim: int = 16) -> list:
    """One LightningIndexer per attention layer of `model`, trained on consecutive `window`-token slices of ids by
    KL(attention || softmax(index scores)) over causal rows (DSA's dense warm-up; the model stays frozen)."""
    from synodic.models.attention import Attention
    from synodic.models.indexer import LightningIndexer
    attns = [a for a in model.modules() if isinstance(a, Attention)]
    cfg = model.config.model_copy(update=dict(index_n_heads=n_heads, index_head_dim=head_dim, index_rope_dim=rope_dim))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        idx = [LightningIndexer(cfg) for _ in attns]
    opt = torch.optim.Adam([p for m in idx for p in m.parameters()], lr=lr)
    windows = ids[: ids.shape[0] // window * window].view(-1, window)
    if windows.shape[0] == 0:
        raise ValueError(f"distill: {ids.shape[0]} tokens give no {window}-token training window")
    pos = torch.arange(window)
    causal = pos[:, None] >= pos[None, :]
    targets = []
    for w in windows:  # the frozen model's layer inputs and attention targets, once per window
        hs = layer_inputs(model, w)
        with torch.no_grad():
            targets.append([(hs[i], attention_scores(a, hs[i], 0) / a.nq) for i, a in enumerate(attns)])
    for step in range(steps):
        loss = 0.0
        for i, m in enumerate(idx):
            h, p = targets[step % len(targets)][i]
            out = m(h, pos)
            s = type(m).scores(out.q, out.w, out.k).masked_fill(~causal, float("-inf"))
            logq = s.log_softmax(-1).masked_fill(~causal, 0.0)
            loss = loss - (p * logq).sum(-1).mean()  # the KL up to p's entropy, a constant: the same gradient
        opt.zero_grad()
        loss.backward()
        opt.step()
    return idx


def save_distilled(model, indexers: list, out_dir: str, tokenizer_from=None):
    """`model` with `indexers` attached to its attention layers, as a checkpoint (config.json names the indexer
    shape, so `HybridLM` rebuilds the modules; the tokenizer is copied from `tokenizer_from` when given)."""
    import shutil
    from pathlib import Path

    from synodic.models.attention import Attention
    from synodic.models.weights import save_checkpoint
    ix = indexers[0]
    model.config = type(model.config).model_validate({**model.config.model_dump(), "index_n_heads": ix.n_heads,
                                                      "index_head_dim": ix.head_dim, "index_rope_dim": ix.rot})
    for attn, m in zip((a for a in model.modules() if isinstance(a, Attention)), indexers):
        attn.indexer = m
    out = save_checkpoint(model, out_dir)
    if tokenizer_from is not None and (Path(tokenizer_from) / "tokenizer.json").is_file():
        shutil.copy(Path(tokenizer_from) / "tokenizer.json", out / "tokenizer.json")
    return out


def replay_buffer(sels: list[list[int]], capacity: int) -> tuple[float, float]:
    """(mean overlap of consecutive selections / k, share of selected rows an LRU buffer of `capacity` rows would
    fetch), over steps 1.. of `sels` (step 0 seeds the buffer, as a prefill's last selection does)."""
    lru: OrderedDict[int, None] = OrderedDict((p, None) for p in sels[0][-capacity:])
    overlap, fetched, selected = [], 0, 0
    for prev, cur in zip(sels, sels[1:]):
        overlap.append(len(set(prev) & set(cur)) / len(cur))
        newest = max(cur)  # the step's own token sits in the reserved slot: never fetched
        for p in cur:
            if p in lru:
                lru.move_to_end(p)
            else:
                if p != newest:
                    fetched += 1
                lru[p] = None
                if len(lru) > capacity:
                    lru.popitem(last=False)
        selected += len(cur)
    return sum(overlap) / len(overlap), fetched / selected


def measure(model, ids: torch.Tensor, steps: int, top_k: int, buffer: float, distilled: list | None = None,
            fresh: list | None = None) -> list[dict]:
    """Per attention layer and scorer: overlap and LRU fetch share over the last `steps` + 1 positions of ids
    (`distilled` / `fresh`: one trained / untrained LightningIndexer per attention layer)."""
    from synodic.models.attention import Attention
    attns = [a for a in model.modules() if isinstance(a, Attention)]
    hs = layer_inputs(model, ids)
    t0 = ids.shape[0] - steps - 1
    rows = []
    for i, attn in enumerate(attns):
        indexers = {"learned": attn.indexer, "distilled": distilled and distilled[i], "fresh": fresh and fresh[i]}
        scorers = {"attention": lambda h, a=attn: attention_scores(a, h, t0)}
        scorers.update({name: (lambda h, m=m: indexer_scores(m, h, t0))
                        for name, m in indexers.items() if m is not None})
        for name, fn in scorers.items():
            with torch.no_grad():
                s = fn(hs[i])
            sels = [s[j].topk(min(top_k, t0 + j + 1)).indices.tolist() for j in range(s.shape[0])]
            ov, fetch = replay_buffer(sels, int(buffer * top_k))
            rows.append({"layer": i, "scorer": name, "overlap": ov, "lru_fetch": fetch,
                         "random_fetch": 1 - min(1.0, buffer * top_k / ids.shape[0])})
    return rows


def heldout_ids(n: int) -> torch.Tensor:
    from synodic.data.corpus import heldout_tokens
    from synodic.data.tokenizer import load_tokenizer
    return torch.tensor(heldout_tokens(load_tokenizer().encode, n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default="locality.json")
    ap.add_argument("--tokens", type=int, default=2048, help="window length (the tiny models trained at 2048)")
    ap.add_argument("--steps", type=int, default=64, help="decode steps measured at the end of the window")
    ap.add_argument("--top-k", type=int, default=256, help="rows selected per step (bench_long: 2048 of 16384)")
    ap.add_argument("--buffer", type=float, default=2.0, help="LRU buffer in multiples of top-k (hisparse: 2)")
    ap.add_argument("--distill-steps", type=int, default=0, help="also train a lightning indexer per attention layer "
                    "of the trained models for this many steps (KL to attention) and score with it ('distilled')")
    ap.add_argument("--save-distilled", default=None, metavar="DIR", help="with --distill-steps: write tiny_mamba2 "
                    "(trained) with its distilled indexers as a checkpoint (model.weights=DIR)")
    args = ap.parse_args(argv)
    if args.save_distilled and not args.distill_steps:
        ap.error(f"argument --save-distilled: {args.save_distilled}: expected --distill-steps > 0 with it")
    for key, v, ok in (("tokens", args.tokens, args.tokens >= 16), ("steps", args.steps, 1 <= args.steps < args.tokens),
                       ("top-k", args.top_k, 1 <= args.top_k < args.tokens), ("buffer", args.buffer, args.buffer >= 1),
                       ("distill-steps", args.distill_steps, args.distill_steps >= 0)):
        if not ok:
            ap.error(f"argument --{key}: {v}: out of range; expected tokens >= 16, 1 <= steps < tokens, "
                     "1 <= top-k < tokens, buffer >= 1, distill-steps >= 0")
    from synodic.graph import load_model
    from synodic.models.choice import ModelChoice
    train_tokens = 8 * 512 if args.distill_steps else 0  # training windows follow the measured one
    all_ids = heldout_ids(args.tokens + train_tokens)
    ids, train_ids = all_ids[:args.tokens], all_ids[args.tokens:]
    res = {"tokens": args.tokens, "steps": args.steps, "top_k": args.top_k, "buffer": args.buffer,
           "distill_steps": args.distill_steps, "rows": []}
    for label, kind, weights in MODELS:
        model, ckpt = load_model(ModelChoice(kind=kind, weights=weights), torch.device("cpu"), torch.float32)
        distilled = fresh = None
        if args.distill_steps and weights == "auto":  # the same seeded init, trained and not
            distilled = distill_indexers(model, train_ids, args.distill_steps)
            fresh = distill_indexers(model, train_ids, 0)
        for r in measure(model, ids, args.steps, args.top_k, args.buffer, distilled, fresh):
            res["rows"].append({"model": label, **r})
            print(f"{label:20s} layer {r['layer']} {r['scorer']:9s} overlap {r['overlap']:.3f}  "
                  f"LRU fetch {100 * r['lru_fetch']:5.1f} %", flush=True)
        if args.save_distilled and kind == "tiny_mamba2" and distilled:
            res["saved"] = str(save_distilled(model, distilled, args.save_distilled, ckpt))
            print(f"saved {label} with distilled indexers: {res['saved']}", flush=True)
    lines = [f"Top-k locality, {args.tokens}-token held-out window, last {args.steps} steps, k = {args.top_k}, "
             f"LRU buffer {args.buffer:g}k", "",
             "| model | layer | scorer | consecutive overlap | LRU fetch share | no locality (1 - B/T) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['layer']} | {r['scorer']} | {r['overlap']:.3f} | {100 * r['lru_fetch']:.1f} % | "
              f"{100 * r['random_fetch']:.1f} % |" for r in res["rows"]]
    res["table_md"] = "\n".join(lines)
    print("\n" + res["table_md"])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
