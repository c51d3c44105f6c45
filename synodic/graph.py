"""Graph builder: validated RunConfig → ServingGraph (model + SSM backend + KV policy + spec + quant).
Hardware checks happen here, before any large allocation, and fail with one line each."""
from dataclasses import dataclass, field
from pathlib import Path

import torch

from synodic.config.errors import ConfigError
from synodic.models.fuse import fuse_projections

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BuildContext:
    model: torch.nn.Module
    device: torch.device
    max_slots: int
    max_seq_len: int
    window: int = 1  # largest verify window (1 + drafts) the state backend and KV policy must hold
    model_kind: str = ""  # the model option's kind (a spec drafter's shipped weights are per target)
    host_buffer: object = None  # a pinned byte buffer the host-tiered KV pools take their rows from (HostKVPool)


@dataclass
class ServingGraph:
    cfg: object
    model: torch.nn.Module
    codec: object
    device: torch.device
    max_slots: int
    max_seq_len: int
    cuda_graphs: bool
    overlap: bool = False  # overlapped decode steps (Engine), see check_overlap
    ssm: object = None
    kv: object = None
    spec: object = None
    quant: object = None
    ckpt_dir: Path | None = None
    weight_bytes: dict[int, int] = field(default_factory=dict)  # rows per step → linear weight bytes
    embed_row_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def step_bytes(self, slots: list[int], lengths: list[int], T: int = 1, accepted: list[int] | None = None
                   ) -> dict[str, int]:
        """Bytes one decode step (T = 1) or verify window (committing accepted[i] tokens of row i) moves for
        rows in these slots with these context lengths (new token included). A query: `advance` then moves
        the backends' host mirrors past the step."""
        b = len(lengths)
        if (b * T) not in self.weight_bytes:
            self.weight_bytes[b * T] = linear_weight_bytes(self.model, b * T)
        out = {"weights_read": self.weight_bytes[b * T] + b * T * self.embed_row_bytes + moe_bytes_read(self.model)}
        if self.ssm is not None:
            out.update(self.ssm.step_bytes(slots, T, accepted))
        if self.kv is not None:
            out.update(self.kv.bytes_for([n + t for n in lengths for t in range(T)]))
        return out

    def advance(self, slots: list[int], T: int = 1, accepted: list[int] | None = None) -> None:
        """Once per executed step, after step_bytes: the state backend's host mirror (replay cursors) moves on."""
        if self.ssm is not None:
            self.ssm.host_step(slots, T, accepted)


def resolve_device(rt) -> torch.device:
    if rt.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["runtime.device='cuda': no CUDA device on this machine; expected "
                           "runtime.device=cpu or auto"])
    if rt.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(rt.device)


def checkpoint_dir(choice) -> Path | None:
    """The checkpoint a model choice loads: an explicit directory, or the shipped one for `auto`
    (unless overrides change the architecture), else None (random weights)."""
    from synodic.models.weights import shipped_dir
    if choice.weights not in ("auto", "random"):
        return Path(choice.weights)
    if choice.weights == "auto" and not choice.overrides:
        return shipped_dir(choice.kind)
    return None


def load_model(choice, device, dtype, arch=None):
    """arch: choice.architecture() when the caller has it already (it may print a note, so once a build)."""
    from synodic.models.weights import load_checkpoint, random_model
    ckpt = checkpoint_dir(choice)
    if ckpt is not None:
        return load_checkpoint(ckpt, device, dtype).eval(), ckpt
    return random_model(arch or choice.architecture(), choice.seed, device, dtype).eval(), None


def build_graph(cfg, max_seq_len: int, max_slots: int | None = None, window: int = 1) -> ServingGraph:
    """`window`: a verify window to reserve beyond the spec scheme's own (tests that feed synthetic drafts)."""
    device = resolve_device(cfg.runtime)
    window = max(window, cfg.spec.window)
    check_spec_window(cfg, window)
    arch = None
    if hasattr(cfg.spec, "directory"):
        # a missing or unshipped drafter, or one trained for another target, fails before the target loads
        arch = cfg.model.architecture()
        cfg.spec.directory(cfg.model.kind, arch)
    torch.manual_seed(cfg.runtime.seed)
    model, ckpt = load_model(cfg.model, device, DTYPES[cfg.model.dtype], arch)
    from synodic.engine.text import load_codec
    slots = max_slots or cfg.runtime.max_slots
    ctx = BuildContext(model=model, device=device, max_slots=slots, max_seq_len=max_seq_len, window=window,
                       model_kind=cfg.model.kind)
    cuda_graphs = device.type == "cuda" if cfg.runtime.cuda_graphs is None else cfg.runtime.cuda_graphs
    g = ServingGraph(cfg=cfg, model=model, codec=load_codec(ckpt), device=device, max_slots=slots,
                     max_seq_len=max_seq_len, cuda_graphs=cuda_graphs, ckpt_dir=ckpt)
    g.quant = cfg.quant.build(ctx)  # may swap the model's linears for quantized ones, so first
    fuse_projections(model)  # after quantization: only plain linears share a GEMM
    g.ssm = cfg.ssm.build(ctx) if model.ssm_layers else None
    g.kv = cfg.kv.build(ctx) if model.attention_layers else None
    check_rollback(g, cfg, window)
    g.spec = cfg.spec.build(ctx)
    from synodic.kv.drafter_ring import count_drafter_ring
    count_drafter_ring(g)  # kv=adaptive's device budget holds the drafter's context ring too
    check_cuda_graphs(g, cfg.kv, cfg.runtime.cuda_graphs)
    g.overlap = check_overlap(g, cfg.kv, cfg.runtime.overlap)
    emb = model.embed_tokens.weight
    g.embed_row_bytes = emb.shape[1] * emb.element_size()
    return g


def check_spec_window(cfg, window: int) -> None:
    """The verify window (1 + γ) must fit the state backend's ring (ssm=replay verifies from checkpoint +
    ring; the KV policies check their own reservations when built)."""
    L = getattr(cfg.ssm, "ring_len", None)
    if window > 1 and L is not None and window > L:
        raise ConfigError([f"spec.num_speculative_tokens={window - 1} with ssm.ring_len={L}: expected "
                           f"num_speculative_tokens <= {L - 1} (the verify window of 1 + γ tokens must fit the ring)"])


def check_rollback(g: "ServingGraph", cfg, window: int) -> None:
    """Verify windows need a state backend that commits only the accepted prefix (rolls back the rest)."""
    if window > 1 and g.ssm is not None and not g.ssm.rolls_back:
        raise ConfigError([f"spec={cfg.spec.kind} with ssm={cfg.ssm.kind}: expected a state backend that rolls "
                           "back a verify window's rejected tail (ssm=eager or ssm=replay)"])


def check_overlap(g: ServingGraph, kv_cfg, asked: bool | None) -> bool:
    """Overlapped steps need a KV policy whose host side does not depend on the step in flight
    (`overlap_safe`). true with one that is not: a one-line error; null: on where allowed."""
    ok = g.kv is None or g.kv.overlap_safe
    if asked and not ok:
        raise ConfigError([f"runtime.overlap=true with kv={kv_cfg.kind}: expected runtime.overlap=false or null; "
                           f"{type(g.kv).__name__} plans each step on the host from the previous step's results"])
    return ok if asked is None else asked


def check_cuda_graphs(g: ServingGraph, kv_cfg, asked: bool | None) -> None:
    """CUDA graphs need a KV policy whose decode step is capturable (`graph_safe`: every built-in one is;
    each policy's step documents why). Otherwise: runtime.cuda_graphs=true (`asked`) fails, null turns
    them off with a note."""
    if not g.cuda_graphs or g.kv is None or g.kv.graph_safe:
        return
    if asked:
        raise ConfigError([f"runtime.cuda_graphs=true with kv={kv_cfg.kind}: expected runtime.cuda_graphs=false "
                           f"or null; {type(g.kv).__name__} decode steps cannot be captured (not graph_safe)"])
    g.cuda_graphs = False
    g.notes.append(f"cuda_graphs off: kv={kv_cfg.kind} steps are not captured")


def moe_bytes_read(model: torch.nn.Module) -> int:
    """Bytes of the routed experts the last forward read, over the model's MoE MLPs (synodic/models/moe.py;
    reading their per-expert hit counts waits for the step). 0 without MoE."""
    moe = getattr(model, "_moe_modules", None)
    if moe is None:
        moe = model._moe_modules = [m for m in model.modules() if hasattr(m, "expert_bytes_read")]
    return sum(m.expert_bytes_read() for m in moe)


def linear_weight_bytes(model: torch.nn.Module, rows: int = 1) -> int:
    """Bytes of every linear's weight a step over `rows` token rows reads (a module's own
    `weight_bytes(rows)` when it stores packed codes + scales and picks its path by row count)."""
    total = 0
    for m in model.modules():
        if hasattr(m, "weight_bytes"):
            total += m.weight_bytes(rows)
        elif isinstance(m, torch.nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total
