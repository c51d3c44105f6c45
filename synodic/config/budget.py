"""Memory estimate of a run before anything is allocated: model weights, SSM state slots, KV pool and
the workload's per-sequence buffers, against what the device has. A run that cannot fit is refused
with one line naming the key that asks for the most, instead of being killed for memory later."""
from __future__ import annotations

import math

GiB = 2 ** 30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp32": 4, "bf16": 2}


def available_bytes(device) -> int:
    import torch
    if getattr(device, "type", str(device)) == "cuda":
        if not torch.cuda.is_available():  # torch would assert; the callers name the key that chose the device
            from .errors import ConfigError
            raise ConfigError([f"device={str(device)!r}: no CUDA device on this machine; expected cpu or auto"])
        return torch.cuda.mem_get_info(device)[1]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _arch(cfg):
    from synodic.models.config import HybridConfig
    from synodic.models.presets import PRESETS
    try:
        return cfg.model.architecture()
    except Exception:  # a damaged checkpoint is reported by the model group's validator
        return HybridConfig.model_validate({**PRESETS[cfg.model.kind].model_dump(), **cfg.model.overrides})


def n_params(arch) -> int:
    import torch

    from synodic.models.lm import HybridLM
    with torch.device("meta"):
        return sum(p.numel() for p in HybridLM(arch).parameters())


def _saved_bytes(arch, seq: int, chunk: int | None) -> int:
    """Bytes autograd saves for backward in one forward + loss of a [1, seq] batch, traced on the meta
    device (nothing is allocated): every saved tensor's storage counted once, parameters excluded."""
    import torch
    import torch.nn.functional as F

    from synodic.models.lm import HybridLM
    with torch.device("meta"):
        m = HybridLM(arch)
    if chunk:
        for layer in m.ssm_layers:
            layer.chunk = chunk
    params = {q.untyped_storage()._cdata for q in m.parameters()}
    seen: dict[int, int] = {}
    alive = []  # holding each storage keeps its address from being reused by a later one

    def pack(t):
        st = t.untyped_storage()
        alive.append(st)
        if st._cdata not in params:
            seen[st._cdata] = max(seen.get(st._cdata, 0), st.nbytes())
        return t

    x = torch.zeros(1, seq, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = m(x)
        F.cross_entropy(logits.float().flatten(0, 1), x.flatten())
    return sum(seen.values())


def train_activation_bytes(arch, seq_len: int, batch: int, chunk: int | None, bf16: bool) -> int:
    """Activation memory of one training step. Traced exactly at seq_len up to 512 tokens; beyond, a
    quadratic in the sequence length fitted through traces at 128 / 256 / 512 (chunked scans are linear,
    materialised attention scores quadratic). Plus the backward's transient fp32 logits gradient. Under
    bf16 autocast most saved tensors are half the size: halved (an estimate, not a trace)."""
    if seq_len <= 512:
        per_seq = _saved_bytes(arch, seq_len, chunk)
    else:
        s = (128, 256, 512)
        f = [_saved_bytes(arch, n, chunk) for n in s]
        # Newton form of the quadratic through the three points, evaluated at seq_len
        d1, d2 = (f[1] - f[0]) / (s[1] - s[0]), (f[2] - f[1]) / (s[2] - s[1])
        c = (d2 - d1) / (s[2] - s[0])
        per_seq = f[0] + d1 * (seq_len - s[0]) + c * (seq_len - s[0]) * (seq_len - s[1])
    act = batch * max(per_seq, 0) * (0.5 if bf16 else 1.0)
    return int(act + batch * seq_len * arch.vocab_size * 4)


def _train_device(cfg):
    import torch
    d = cfg.pipeline.device
    if d == "cuda" and not torch.cuda.is_available():  # refused before the estimate asks the device its memory
        from .errors import ConfigError
        raise ConfigError([f"pipeline.device='cuda' with pipeline={cfg.pipeline.kind}: no CUDA device on this "
                           f"machine; expected pipeline.device=cpu or auto"])
    if d == "auto":
        d = cfg.runtime.device if cfg.runtime.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(d)


def train_estimate(a, p, dev: str, model_key: str, limit: int | None = None, prefix: str = "pipeline."
                   ) -> dict[str, tuple[str, int]]:
    """Training's part of `estimate`: fp32 master weights + grads + two AdamW moments (under model_key), and the
    activations saved for backward, counted (under the batch size's key: prefix + batch_size)."""
    out = {"weights, grads, AdamW moments": (model_key, n_params(a) * 16)}
    if limit is not None and out["weights, grads, AdamW moments"][1] > limit:
        return out
    from synodic.train.config import default_batch
    bf16 = p.precision == "bf16" or (p.precision == "auto" and dev == "cuda")
    batch = p.batch_size or default_batch(dev)
    out["activations"] = (f"{prefix}batch_size", train_activation_bytes(a, p.seq_len, batch, p.scan_chunk, bf16))
    return out


def refuse_if_over(est: dict, have: int, fraction: float, dev: str, value=None) -> None:
    """The one-line refusal when the estimate `est` exceeds fraction of `have` bytes, naming its largest part's
    key (`value(key)`: the key's value when the key does not carry it)."""
    from .errors import ConfigError
    total = sum(b for _, b in est.values())
    if total <= fraction * have:
        return
    what, (key, b) = max(est.items(), key=lambda kv: kv[1][1])
    parts = ", ".join(f"{w} {v / GiB:.1f}" for w, (_, v) in est.items())
    val = key.split("=", 1)[1] if "=" in key else (value(key) if value else None)
    name = key.split("=", 1)[0]
    raise ConfigError([f"{name}={val!r}: the run needs an estimated {total / GiB:.1f} GiB ({parts} GiB; "
                       f"{what} the largest) but the {dev} has {have / GiB:.1f} GiB; "
                       f"expected a smaller {name}{_hint(name)} (or a bigger device)"])


def estimate(cfg, limit: int | None = None) -> dict[str, tuple[str, int]]:
    """{what: (the key that sizes it, bytes)}. With `limit`, training's activation trace is skipped when
    the weights and optimizer state alone exceed it (an 8B preset's trace takes tens of seconds)."""
    a = _arch(cfg)
    wbytes = _DTYPE_BYTES.get(str(cfg.model.dtype), 4)
    out = {"model weights": (f"model={cfg.model.kind}", n_params(a) * wbytes)}
    p = cfg.pipeline
    if p.kind == "train":
        return train_estimate(a, p, _train_device(cfg).type, f"model={cfg.model.kind}", limit)
    if p.kind == "train_drafter":
        # the frozen target's weights and one no-grad forward's residual streams; the drafter's fp32 logits over
        # every trained block position dominate what it saves (logits, softmax, the target's, the gradient)
        gamma = getattr(cfg.spec, "num_speculative_tokens", 7)
        seq = p.prompt_len + p.new_tokens
        # named by the factor furthest above the recipe's default (the pipeline's field defaults)
        d = {k: f.default for k, f in type(p).model_fields.items()}
        seq_key = "pipeline.prompt_len" if p.prompt_len >= p.new_tokens else "pipeline.new_tokens"
        longer = seq / (d["prompt_len"] + d["new_tokens"]) > p.batch / d["batch"]
        out["target forward"] = (seq_key if longer else "pipeline.batch",
                                 p.batch * seq * a.hidden_size * 4 * (a.num_hidden_layers + 1)
                                 + p.batch * seq * a.vocab_size * 4)
        out["drafter logits and gradients"] = ("pipeline.batch",
                                               4 * p.batch * p.anchors_per_seq * gamma * a.vocab_size * 4)
        return out
    slots = cfg.runtime.max_slots
    mamba = a.count("mamba2") * (a.mamba_num_heads * a.mamba_head_dim * a.ssm_state_size * 4 +
                                 (a.mamba_num_heads * a.mamba_head_dim + 2 * a.n_groups * a.ssm_state_size) *
                                 a.conv_kernel * 4)
    gdn = a.count("gdn") * (a.linear_num_value_heads * a.linear_key_head_dim * a.linear_value_head_dim * 4 +
                            (2 * a.linear_num_key_heads * a.linear_key_head_dim +
                             a.linear_num_value_heads * a.linear_value_head_dim) * a.linear_conv_kernel_dim * 4)
    out["SSM state slots"] = ("runtime.max_slots", slots * (mamba + gdn))
    window = getattr(cfg.spec, "window", 1)
    if cfg.ssm.kind == "eager" and window > 1:  # ssm=eager keeps one state per verify-window position and slot
        out["SSM verify-window states"] = ("spec.num_speculative_tokens", slots * (window - 1) * (mamba + gdn))
    kv = cfg.kv
    per_token = a.count("attention") * a.num_key_value_heads * a.head_dim * 2 * wbytes
    blocks = getattr(kv, "num_blocks", 0) + getattr(kv, "host_num_blocks", 0)
    out["KV pool"] = ("kv.num_blocks", blocks * getattr(kv, "block_size", 16) * per_token)
    if hasattr(kv, "index_num_blocks"):
        # the host-tiered policies (synodic/kv/hot.py, indexer.py): int32 tables of B hot slots per (request,
        # attention layer) and of every indexed position's hot slot; the indexer's key per position and layer
        # (counted at a KV head's width, 2 bytes). Their rows of KV live in the device pool, counted above.
        NL, hot = a.count("attention"), kv.hot_buffer or 2 * kv.top_k
        out["KV hot-buffer tables"] = ("kv.hot_buffer" if kv.hot_buffer else "kv.top_k",
                                       NL * (slots + 1) * (2 * hot + 1) * 4)
        out["KV indexer key cache"] = ("kv.index_num_blocks", (kv.index_num_blocks + 1) * kv.block_size * NL *
                                       (a.num_key_value_heads * a.head_dim * 2 + 4))
    wl = cfg.workload
    seq = (getattr(wl, "prompt_len", 0) + getattr(wl, "output_len", 0) + getattr(wl, "max_tokens", 0) + 1)
    key = "workload.max_tokens" if hasattr(wl, "max_tokens") else "workload.output_len"
    if (getattr(p, "max_tokens", 0) or 0) > seq:  # a pipeline's own length (eval) sizes the buffers: name it
        seq, key = p.max_tokens, "pipeline.max_tokens"
    # per slot: block table row, token and position buffers (int64), one step's fp32 logits
    out["workload buffers"] = (key, slots * (math.ceil(seq / getattr(kv, "block_size", 16)) * 4 + seq * 16) +
                               slots * a.vocab_size * 4)
    # prompt lookup's device token history (ModelRunner.track_history), int64; counted for every scheme: whether a
    # neural drafter looks up is known only once its files are read
    if cfg.spec.kind != "none":
        out["drafter token history"] = (key, (slots + 1) * (seq + 2 * window) * 8)
    if getattr(cfg.spec, "verify", "fixed") == "load_aware":
        # LazyRing: a closed gate's plain steps buffer up to min(max_wait + 1 = 257, context_window) fused target
        # features per slot (counted at fp32, the widest drafter dtype) and their positions
        rows = min(257, cfg.spec.context_window)
        out["drafter deferred context"] = ("spec.context_window", (slots + 1) * rows * (a.hidden_size * 4 + 8))
    return out


# a synthetic request's tokens are Python ints in lists on the host (prompt and outputs): a list slot and an int
# object each (ints above 256 are not shared)
REQUEST_TOKEN_BYTES = 36


def request_bytes(cfg) -> dict[str, tuple[str, int]]:
    """{what: (key, bytes)} of a synthetic workload's requests, which are built on the host before decoding."""
    wl = cfg.workload
    if not hasattr(wl, "num_requests") or cfg.pipeline.kind != "decode":  # (the only pipeline that serves them)
        return {}
    return {"workload requests": ("workload.num_requests", wl.num_requests * (wl.prompt_len + wl.output_len) *
                                  REQUEST_TOKEN_BYTES)}


def check_fits(cfg, device, fraction: float = 0.9) -> None:
    if cfg.pipeline.kind in ("train", "train_drafter"):
        device = _train_device(cfg)  # what the trainer will use, not the runtime group's device
    have = available_bytes(device)
    est = estimate(cfg, limit=int(fraction * have))
    host = request_bytes(cfg)
    if getattr(device, "type", str(device)) == "cpu":
        est.update(host)
    elif host:
        refuse_if_over(host, available_bytes("cpu"), fraction, "host", lambda key: _value(cfg, key))
    total = sum(b for _, b in est.values())
    _check_local_replicas(cfg, device, total, fraction * have)
    refuse_if_over(est, have, fraction, getattr(device, "type", device), lambda key: _value(cfg, key))


# what one CPU replica's process holds beside its model (Python, torch, the Ray worker): a rounded-up
# allowance, not an estimate of the model (docs/reliability.md)
REPLICA_PROCESS_BYTES = int(0.45 * GiB)


def _check_local_replicas(cfg, device, per_run: int, room: float) -> None:
    """runtime=ray on a local instance with CPU replicas: every replica is a process holding its own model and
    buffers on this machine, so their number is bounded by its memory (Ray itself would start them all)."""
    rt = cfg.runtime
    if getattr(rt, "kind", "local") != "ray" or rt.address or getattr(device, "type", str(device)) != "cpu":
        return
    n, per = rt.replicas or 1, per_run + REPLICA_PROCESS_BYTES
    if n * per > room:
        from .errors import ConfigError
        fit = max(0, int(room // per))
        raise ConfigError([f"runtime.replicas={n}: {n} CPU replicas of about {per / GiB:.2f} GiB each (a process, "
                           f"its model and buffers) need {n * per / GiB:.1f} GiB but this machine has "
                           f"{room / GiB:.1f} GiB to give; expected runtime.replicas <= {fit} (or runtime.address= "
                           "a cluster)"])


def _hint(name: str) -> str:
    return {"pipeline.batch_size": " or pipeline.seq_len", "batch_size": " or seq_len",
            "pipeline.batch": " or pipeline.anchors_per_seq", "pipeline.prompt_len": " or pipeline.new_tokens",
            "pipeline.new_tokens": " or pipeline.prompt_len"}.get(name, "")


def _value(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part, None)
    if obj is None and key == "pipeline.batch_size":  # null: the value picked for the device
        from synodic.train.config import default_batch
        return default_batch(_train_device(cfg).type)
    return obj
