"""Teacher-forced quality metrics.

* bits per byte = total NLL of the text in bits / its UTF-8 bytes. The token stream is [EOT] + the
  text's tokens, so every byte of the text is predicted: the number does not depend on the tokenizer.
* perplexity = exp(mean NLL per token).
* comparison of a scorer against a reference scorer on the same windows: KL(p_ref ‖ p) per position
  (mean, p95), p95 |Δ log-prob| of the actual next token, top-1 agreement.

A scorer is any callable `ids [b,T] → logits [b,T,V]` (a HybridLM, a quantized copy, ...). Windows
are non-overlapping, seq_len tokens each, scored from an empty state.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F


def token_stream(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.eot_id] + tokenizer.encode(text), dtype=torch.long)


def _windows(stream: torch.Tensor, seq_len: int, min_len: int = 1):
    """(start, end) pairs: inputs stream[start:end-1], targets stream[start+1:end]."""
    n = len(stream)
    for s in range(0, n - 1, seq_len):
        e = min(s + seq_len + 1, n)
        if e - s - 1 >= min_len:
            yield s, e


def _batches(stream, seq_len, batch_size, min_len=1):
    """Batches of equal-length windows (the ragged last window goes alone)."""
    wins = list(_windows(stream, seq_len, min_len))
    full = [w for w in wins if w[1] - w[0] == seq_len + 1]
    for i in range(0, len(full), batch_size):
        yield torch.stack([stream[s:e] for s, e in full[i:i + batch_size]])
    for s, e in wins:
        if e - s != seq_len + 1:
            yield stream[s:e][None]


def _autocast(device: torch.device, bf16: bool):
    if bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def nll(scorer, stream: torch.Tensor, seq_len: int = 2048, batch_size: int = 8, device="cpu",
        bf16: bool = False, max_tokens: int | None = None) -> tuple[float, int]:
    """Sum of next-token NLL (nats, float64) over the stream and the number of predicted tokens."""
    device = torch.device(device)
    if max_tokens is not None:
        stream = stream[:max_tokens + 1]
    total, count = 0.0, 0
    for batch in _batches(stream, seq_len, batch_size):
        batch = batch.to(device)
        with _autocast(device, bf16):
            logits = scorer(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total += float(loss.double())
        count += batch[:, 1:].numel()
    return total, count


def bits_per_byte(nll_nats: float, n_bytes: int) -> float:
    return nll_nats / math.log(2) / n_bytes


def heldout_metrics(scorer, tokenizer, text: str, seq_len: int = 2048, batch_size: int = 8,
                    device="cpu", bf16: bool = False) -> dict:
    """Bits per byte and perplexity of a scorer on a whole text."""
    stream = token_stream(tokenizer, text)
    total, count = nll(scorer, stream, seq_len, batch_size, device, bf16)
    n_bytes = len(text.encode("utf-8"))
    return {"bits_per_byte": bits_per_byte(total, n_bytes), "perplexity": math.exp(total / count),
            "nll_per_token": total / count, "tokens": count, "bytes": n_bytes,
            "bytes_per_token": n_bytes / count}


@torch.no_grad()
def compare(scorer, reference, stream: torch.Tensor, seq_len: int = 2048, batch_size: int = 4,
            device="cpu", max_tokens: int | None = None) -> dict:
    """Teacher-forced comparison of `scorer` against `reference` over windows of exactly seq_len
    tokens (the ragged tail is dropped). Both see the same inputs; distributions in fp32."""
    device = torch.device(device)
    if max_tokens is not None:
        stream = stream[:max(max_tokens, seq_len) + 1]
    kls, dlp, agree = [], [], []
    for batch in _batches(stream, seq_len, batch_size, min_len=seq_len):
        if batch.shape[1] != seq_len + 1:
            continue
        batch = batch.to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        lp_ref = F.log_softmax(reference(x).float(), -1)
        lp = F.log_softmax(scorer(x).float(), -1)
        kls.append((lp_ref.exp() * (lp_ref - lp)).sum(-1).cpu())  # [windows, seq_len]
        tgt = y[..., None]
        dlp.append((lp.gather(-1, tgt) - lp_ref.gather(-1, tgt)).abs().flatten().cpu())
        agree.append((lp.argmax(-1) == lp_ref.argmax(-1)).flatten().cpu())
    if not kls:
        raise ValueError(f"stream of {len(stream)} tokens holds no window of seq_len={seq_len}")
    by_pos = torch.cat(kls).double()
    quarters = [float(q.mean()) for q in by_pos.chunk(4, dim=1)]  # does the error grow along the window?
    kl, d, a = by_pos.flatten(), torch.cat(dlp).double(), torch.cat(agree)
    return {"kl_mean": float(kl.mean()), "kl_p95": _q(kl, 0.95), "kl_max": float(kl.max()),
            "kl_mean_by_quarter": quarters,
            "dlogprob_p95": _q(d, 0.95), "top1_agreement": float(a.float().mean()),
            "positions": int(kl.numel()), "seq_len": seq_len}


def _q(x: torch.Tensor, q: float) -> float:
    """Quantile without torch.quantile's input-size limit (nearest-rank on the sorted values)."""
    s = x.sort().values
    return float(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))])
