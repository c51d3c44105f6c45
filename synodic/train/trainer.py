"""The training loop: packed sequences, AdamW, warm-up + cosine, gradient clipping, bf16 autocast on
the GPU, periodic held-out evaluation, checkpoint + exact resume, a rich progress bar, and a loss
curve (CSV + PNG) in the run dir.

Run-dir layout:
  checkpoint/state.{safetensors,json}  model, optimiser, data position, RNG, step, history (resume
                        reads them; never a pickle)
  model/                the trained model: config.json, model.safetensors, tokenizer.json
  metrics.csv, loss.png the curve
"""
from __future__ import annotations

import copy
import csv
import json
import logging
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from synodic.config.errors import ConfigError
from synodic.data.corpus import PackedSampler, num_windows
from synodic.data.prepare import prepare
from synodic.evaluation.metrics import heldout_metrics, nll, token_stream
from synodic.models.config import HybridConfig
from synodic.models.weights import random_model, save_checkpoint
from synodic.train import state as ckpt_state


def measure_window(warmup_steps: int) -> tuple[int, int]:
    """Steps between which the step time is timed when max_steps is null: inside the warm-up, whose
    LR does not depend on max_steps, so a rerun with the recorded max_steps follows the same curve."""
    return max(3, warmup_steps * 2 // 5), max(6, warmup_steps * 4 // 5)


def lr_at(step: int, max_steps: int, s) -> float:
    """Linear warm-up to s.lr, then cosine down to s.lr * s.min_lr_ratio at max_steps."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    t = min(1.0, (step - s.warmup_steps) / max(1, max_steps - s.warmup_steps))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _device(s) -> torch.device:
    if s.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if s.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["pipeline.device='cuda': no CUDA device here; expected cpu or auto"])
    return torch.device(s.device)


def _param_groups(model, wd: float):
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv1d" not in name else rest).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def export_model(model, tokenizer_path: Path, out: Path, save_dtype: str) -> Path:
    """config.json + model.safetensors (+ tokenizer.json). bf16: embedding/linear matrices in bf16,
    vectors (norms, A_log, dt_bias, D, conv) in fp32."""
    m = copy.deepcopy(model).float().cpu()
    if save_dtype == "bf16":
        for mod in m.modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                mod.weight.data = mod.weight.data.to(torch.bfloat16)
    save_checkpoint(m, out)
    shutil.copyfile(tokenizer_path, Path(out) / "tokenizer.json")
    return Path(out)


_logger = logging.getLogger(__name__)  # every step line and note also reaches Hydra's run.log
CPU_FINAL_EVAL_CHARS = 131072  # final_eval on the CPU: ~40k tokens of the held-out shard, about a minute


class _Log:
    """Progress bar with loss and tokens/s on a terminal; plain lines otherwise."""

    def __init__(self, total: int | None, start: int, quiet: bool):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.console = Console(stderr=True)
        self.tty = self.console.is_terminal and not quiet
        self.quiet = quiet
        self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                            TimeElapsedColumn(), console=self.console, disable=not self.tty)
        self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *a):
        self.bar.__exit__(*a)

    def total(self, n: int):
        self.bar.update(self.task, total=n)

    def step(self, step: int, loss: float | None, tps: float | None, extra: str = ""):
        kw = {}
        if loss is not None:
            kw = {"loss": f"{loss:.4f}", "tps": f"{tps:,.0f}"}
        self.bar.update(self.task, completed=step, **kw)
        if self.quiet or loss is None:
            return
        line = f"step {step} loss {loss:.4f} tok/s {tps:,.0f} {extra}"
        _logger.info(line.rstrip())
        if not self.tty:
            print(line, flush=True)
        elif extra:
            self.bar.console.print(line)

    def note(self, msg: str):
        _logger.info(msg)
        if not self.quiet:
            self.console.print(msg) if self.tty else print(msg, flush=True)


def train(s, run_dir: str | Path, arch: HybridConfig, quiet: bool = False) -> dict:
    """Train `arch` with settings `s` (a TrainPipeline); returns the results payload."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    device = _device(s)
    if s.batch_size is None:  # picked from the device, and recorded as the value used
        from synodic.train.config import default_batch
        s = s.model_copy(update={"batch_size": default_batch(device.type)})
    bf16 = s.precision == "bf16" or (s.precision == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    data = prepare(s.data, s.tokenizer, s.vocab_size, log=(lambda m: None) if quiet else print)
    tok = data.tokenizer
    n = num_windows(len(data.train), s.seq_len)
    if n < s.batch_size:  # known before the model is built: the corpus is too small for seq_len x batch_size
        raise ConfigError([f"pipeline.seq_len={s.seq_len} with pipeline.data={list(s.data)}: the corpus has "
                           f"{len(data.train)} tokens, {n} windows of seq_len; expected at least "
                           f"pipeline.batch_size={s.batch_size} windows (more data or a smaller pipeline.seq_len)"])
    if arch.vocab_size != tok.vocab_size:
        arch = HybridConfig.model_validate({**arch.model_dump(), "vocab_size": tok.vocab_size})
    model = random_model(arch, s.seed, device, torch.float32)
    if s.scan_chunk:
        for m in model.ssm_layers:
            m.chunk = s.scan_chunk
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(_param_groups(model, s.weight_decay), lr=s.lr, betas=tuple(s.betas),
                            eps=1e-8, fused=device.type == "cuda")
    sampler = PackedSampler(data.train.to(device), s.seq_len, s.batch_size, s.seed)
    held = token_stream(tok, data.heldout_text)
    eval_stream = held[: s.eval_tokens + 1]
    tb = tok.token_bytes()
    eval_bytes = sum(tb[i] for i in eval_stream[1:].tolist())

    ckpt = run_dir / "checkpoint"
    step, tokens, max_steps, history, train_s = 0, 0, s.max_steps, [], 0.0
    log_rows = []  # (step, loss, grad norm, lr) not yet synced to the host; flushed every log_every
    if s.resume and (ckpt / "state.pt").is_file() and not ckpt_state.has_state(ckpt):
        # An older checkpoint format (or a planted file): a pickle is never loaded.
        raise ConfigError([f"pipeline.resume=true: {ckpt / 'state.pt'} is a pickle, which is never loaded "
                           f"(it could run code); expected state.safetensors + state.json, or a new "
                           f"hydra.run.dir / pipeline.resume=false"])
    if s.resume and ckpt_state.has_state(ckpt):
        try:
            st = ckpt_state.load_state(ckpt, device)
        except ValueError as e:
            raise ConfigError([f"pipeline.resume=true: {e}"]) from None
        bad = ckpt_state.resume_conflicts(st.get("settings", {}), s.model_dump(mode="json"),
                                          st.get("arch", {}), arch.model_dump(mode="json"), st["step"])
        if bad:
            raise ConfigError(bad + [f"pipeline.resume=true: {ckpt} cannot continue with the settings "
                                     f"above; expected them unchanged, a new hydra.run.dir or "
                                     f"pipeline.resume=false"])
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sampler.load_state_dict(st["data"])
        torch.set_rng_state(st["rng_cpu"])
        if device.type == "cuda" and st.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(st["rng_cuda"])
        step, tokens, max_steps, history = st["step"], st["tokens"], st["max_steps"], st["history"]
        if s.max_steps is not None and s.max_steps != max_steps:
            # More steps than the checkpoint planned: the cosine restarts its tail from here.
            print(f"note: resuming at step {step} with pipeline.max_steps={s.max_steps} "
                  f"(the checkpoint planned {max_steps})", file=sys.stderr)
            max_steps = s.max_steps
        train_s = st.get("train_s", 0.0)
    else:
        torch.manual_seed(s.seed)

    def flush(tps=None):
        for st_, l_, g_, lr_ in log_rows:
            history.append({"step": st_, "tokens": st_ * s.batch_size * s.seq_len, "train_loss": float(l_),
                            "grad_norm": float(g_), "lr": lr_, "tokens_per_s": tps})
        log_rows.clear()

    def save_state():
        flush()
        ckpt_state.save_state({"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "data": sampler.state_dict(), "rng_cpu": torch.get_rng_state(),
                               "rng_cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None,
                               "step": step, "tokens": tokens, "max_steps": max_steps, "history": history,
                               "train_s": train_s, "arch": arch.model_dump(mode="json"),
                               "settings": s.model_dump(mode="json")}, ckpt)

    def evaluate() -> dict:
        model.eval()
        tot, cnt = nll(model, eval_stream, s.seq_len, max(1, s.batch_size // 2), device, bf16)
        model.train()
        return {"heldout_loss": tot / cnt, "heldout_bpb": tot / math.log(2) / eval_bytes}

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    info = {"params": n_params, "device": str(device), "precision": "bf16" if bf16 else "fp32",
            "corpus": data.info, "batch_size": s.batch_size,
            "tokens_per_step": s.batch_size * s.seq_len}
    t_seg, tok_seg = time.time(), 0
    t_measure = None
    m0, m1 = measure_window(s.warmup_steps)
    halted = False
    model.train()
    with _Log(max_steps, step, quiet) as log:
        log.note(f"training {arch.model_type} ({n_params / 1e6:.2f}M params) on {device} "
                 f"{'bf16' if bf16 else 'fp32'}: {data.info['train_tokens']:,} train tokens, "
                 f"{s.batch_size}x{s.seq_len} per step")
        while max_steps is None or step < max_steps:
            if s.halt_at_step is not None and step >= s.halt_at_step:
                halted = True
                break
            if s.max_steps is None and max_steps is not None and time.time() - t_start > s.time_budget_s:
                log.note(f"time budget {s.time_budget_s:.0f}s reached at step {step}: stopping early")
                max_steps = step
                break
            lr = lr_at(step, max_steps or 10 ** 9, s)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = sampler.next()
            with autocast():
                logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            tokens += batch[:, 1:].numel()
            tok_seg += batch[:, 1:].numel()
            log_rows.append((step, loss.detach(), gnorm.detach(), lr))

            if max_steps is None and step == m0:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t_measure = time.time()
            if max_steps is None and step == m1:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                per = (time.time() - t_measure) / (m1 - m0)
                left = s.time_budget_s - (time.time() - t_start)
                n_evals = 1 + left / per / s.eval_every
                reserve = 0.08 * left + n_evals * 0.3 * per * s.eval_tokens / (s.batch_size * s.seq_len)
                max_steps = max(step + 1, int(step + (left - reserve) / per) // 10 * 10)
                if max_steps <= s.warmup_steps:
                    log.note(f"warning: budget allows {max_steps} steps, fewer than warmup_steps")
                log.total(max_steps)
                log.note(f"step time {per * 1e3:.0f} ms → max_steps={max_steps} for "
                         f"time_budget_s={s.time_budget_s:.0f} (pass max_steps={max_steps} to reproduce)")

            last = max_steps is not None and step >= max_steps
            if step % s.log_every == 0 or last:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                now = time.time()
                tps = tok_seg / max(now - t_seg, 1e-9)
                train_s += now - t_seg
                flush(tps)
                row = history[-1]
                extra = ""
                if step % s.eval_every == 0 or last:
                    row.update(evaluate())
                    extra = f"heldout {row['heldout_loss']:.4f} ({row['heldout_bpb']:.3f} bpb)"
                log.step(step, row["train_loss"], tps, extra)
                t_seg, tok_seg = time.time(), 0
            if step % s.ckpt_every == 0 or last:
                save_state()
        save_state()
        if halted:
            log.note(f"halted at step {step} (halt_at_step); resume continues the same schedule")

    write_curve(history, run_dir)
    result = {"metrics": {"steps": step, "max_steps": max_steps, "tokens_seen": tokens,
                          "train_loss": _mean_tail(history, "train_loss"),
                          "tokens_per_s": tokens / train_s if train_s else None,
                          "wall_s": time.time() - t_start},
              "train": info, "halted": halted}
    if halted:
        return result
    out = export_model(model, data.tokenizer_path, run_dir / "model", s.save_dtype)
    result["model_dir"] = str(out)
    if s.export_to:
        export_model(model, data.tokenizer_path, Path(s.export_to), s.save_dtype)
        result["exported_to"] = s.export_to
    if s.final_eval:
        from synodic.models.weights import load_checkpoint
        shipped = load_checkpoint(out, device, torch.float32).eval()
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        text = data.heldout_text
        if device.type != "cuda" and len(text) > CPU_FINAL_EVAL_CHARS:
            # the whole shard is ~250 forward windows: a quarter of an hour on 2 cores
            cut = text.rfind("\n", 0, CPU_FINAL_EVAL_CHARS)
            text = text[:cut if cut > 0 else CPU_FINAL_EVAL_CHARS]
            log.note(f"final eval on the CPU: the first {len(text):,} of {len(data.heldout_text):,} characters "
                     "of the held-out shard (a GPU run scores all of it)")
            result["metrics"]["final_eval_subset"] = True
        hm = heldout_metrics(shipped, tok, text, s.seq_len, max(1, s.batch_size // 4), device)
        result["metrics"].update(bits_per_byte=hm["bits_per_byte"], perplexity=hm["perplexity"],
                                 heldout_tokens=hm["tokens"], heldout_bytes=hm["bytes"])
        log.note(f"held-out: {hm['bits_per_byte']:.4f} bits/byte, perplexity {hm['perplexity']:.3f} "
                 f"({hm['tokens']:,} tokens, {hm['bytes']:,} bytes; weights as saved, fp32 compute)")
    (run_dir / "train_summary.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _mean_tail(history, key, n=20):
    vals = [h[key] for h in history[-n:] if key in h]
    return sum(vals) / len(vals) if vals else None


def write_curve(history: list[dict], run_dir: Path) -> None:
    """metrics.csv (one row per step) and loss.png (train loss, held-out loss at eval steps)."""
    if not history:
        return
    keys = ["step", "tokens", "train_loss", "heldout_loss", "heldout_bpb", "lr", "grad_norm", "tokens_per_s"]
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for h in history:
            w.writerow({k: h.get(k, "") for k in keys})
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print(f"no loss plot: {e}", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["train_loss"] for h in history], lw=0.8, alpha=0.7, label="train")
    ev = [h for h in history if "heldout_loss" in h]
    if ev:
        ax.plot([h["step"] for h in ev], [h["heldout_loss"] for h in ev], "o-", ms=3, label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "loss.png", dpi=110)
    plt.close(fig)
