"""Neural drafters (DFlash, DSpark, DFlash2): build with random weights, save / load (safetensors + config.json),
and the shipped weights under synodic/assets/drafters/<target>/<scheme>/. The target's embedding and LM head are
shared with the drafter through `DraftModel.bind_target(target)` and never stored with it."""
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from synodic.config.errors import ConfigError

from .config import SCHEMES, DraftConfig, default_target_layers
from .draft import DraftModel

__all__ = ["SCHEMES", "DraftConfig", "DraftModel", "build_draft_model", "save_draft_model", "load_draft_model",
           "check_drafter_dir", "drafter_config", "shipped_drafter_dir", "shipped_drafters", "default_target_layers",
           "num_target_blocks", "quantize_rows", "dequantize_rows"]

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafters"
WEIGHTS = "model.safetensors"


def num_target_blocks(target_cfg) -> int:
    return sum(len(layer) for layer in target_cfg.blocks())


def build_draft_model(scheme: str, target_cfg, target=None, **fields) -> DraftModel:
    """A drafter for `target_cfg` (a HybridConfig) with seeded random weights (fields override DraftConfig's
    defaults; seed= picks the draw). Binds `target` when given."""
    if scheme not in SCHEMES:
        raise ConfigError([f"spec: scheme={scheme!r} has no draft model; expected one of {', '.join(SCHEMES)}"])
    fields.setdefault("target_layers", default_target_layers(num_target_blocks(target_cfg)))
    cfg = DraftConfig(scheme=scheme, vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.hidden_size, **fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = DraftModel(cfg)
    _init(model, cfg.seed)
    return model.bind_target(target) if target is not None else model


def _init(model: DraftModel, seed: int, std: float = 0.02) -> None:
    """N(0, std) for matrices and embeddings; residual output projections scaled by 1/sqrt(2 * layers); norms at
    one, the dynamic convs' base kernels at zero (the convs start near identity)."""
    g = torch.Generator().manual_seed(seed)
    n = len(model.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "mask_embedding":
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif p.dim() >= 2:
                s = std / (2 * n) ** 0.5 if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=g) * s)


SCALE = ".row_scale"     # suffix of an fp8 matrix's per-output-row scales in the safetensors file
FP8_MAX = 448.0           # largest finite float8_e4m3fn
STORAGE = ("fp8", "bfloat16", "float32")


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, ...] → (float8_e4m3fn codes, fp32 scale per row) with w ≈ codes * scale (row amax → 448)."""
    w = w.detach().float()
    scale = (w.abs().flatten(1).amax(1) / FP8_MAX).clamp(min=1e-12)
    codes = (w / scale.view(-1, *[1] * (w.dim() - 1))).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.float().view(-1, *[1] * (codes.dim() - 1))


def _stored(v: torch.Tensor, storage: str) -> dict[str, torch.Tensor]:
    """One state entry as stored: matrices of at least 4096 elements in `storage` (fp8: codes + row scales),
    vectors and small matrices (norms, conv base kernels, calibration temperatures) in fp32."""
    v = v.detach().cpu()
    if not v.is_floating_point():
        return {"": v.contiguous()}
    if v.dim() < 2 or v.numel() < 4096 or storage == "float32":
        return {"": v.float().contiguous()}
    if storage == "bfloat16":
        return {"": v.to(torch.bfloat16).contiguous()}
    codes, scale = quantize_rows(v)
    return {"": codes.contiguous(), SCALE: scale.contiguous()}


def save_draft_model(model: DraftModel, directory, storage: str = "fp8") -> Path:
    """config.json + model.safetensors. storage fp8 (default): matrices as float8 e4m3 with one fp32 scale per
    output row (key + '.row_scale'), dequantized at load into the run's dtype, which keeps every shipped
    drafter a few MB; bfloat16 / float32 store the matrices as such. The bound target's embedding and LM head
    are not parameters of the drafter, so they are never in the file."""
    if storage not in STORAGE:
        raise ValueError(f"save_draft_model: storage={storage!r}; expected one of {', '.join(STORAGE)}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.config.model_dump_json(indent=2) + "\n")
    state = {}
    for k, v in model.state_dict().items():
        state.update({k + suffix: t for suffix, t in _stored(v, storage).items()})
    save_file(state, str(out / WEIGHTS))
    return out


def _dequantized(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored entries → the model's state dict (fp8 codes times their row scales; everything else as is)."""
    out = {}
    for k, v in state.items():
        if k.endswith(SCALE):
            continue
        out[k] = dequantize_rows(v, state[k + SCALE]) if k + SCALE in state else v
    return out


def drafter_config(directory) -> DraftConfig:
    """The config of the drafter saved in `directory`, after checking what needs no target: both files there,
    config.json a DraftConfig with target layers, and model.safetensors' tensor names and shapes those of the
    drafter config.json describes (built on the meta device, from the header: no tensor data read). ValueError
    saying what is wrong and what was expected otherwise (the spec.drafter validator's message)."""
    from synodic.config.files import lookup_problem, safetensors_header
    d = Path(directory)
    bad = lookup_problem(d)
    if bad:
        raise ValueError(f"{bad}; expected auto, random or a directory written by pipeline=train_drafter")
    if not d.is_dir():
        raise ValueError(f"no such directory (expected config.json + {WEIGHTS})")
    for f in ("config.json", WEIGHTS):
        if not (d / f).is_file():
            raise ValueError(f"missing {f} (expected config.json + {WEIGHTS})")
    try:
        cfg = DraftConfig.model_validate(json.loads((d / "config.json").read_text()))
    except Exception as e:  # malformed JSON or fields: one line naming the file
        raise ValueError(f"config.json is not a drafter config ({str(e).splitlines()[0][:100]}); expected the "
                         "config.json pipeline=train_drafter writes") from None
    if not cfg.target_layers or min(cfg.target_layers) < 0:
        raise ValueError(f"config.json has target_layers={list(cfg.target_layers)}; expected a non-empty list of "
                         "target block indices >= 0")
    try:
        stored = {k: shape for k, (_, shape) in safetensors_header(d / WEIGHTS).items()}
    except (OSError, ValueError) as e:
        raise ValueError(f"{WEIGHTS} is not a drafter's weights ({str(e).splitlines()[0][:160]}); expected the "
                         f"{WEIGHTS} pipeline=train_drafter writes") from None
    why = _layout_problem(cfg, stored)
    if why:
        raise ValueError(f"{WEIGHTS}: {why}")
    return cfg


def check_drafter_dir(directory) -> DraftConfig:
    """drafter_config, its problem as a ConfigError line naming spec.drafter."""
    from synodic.config.files import shown
    try:
        return drafter_config(directory)
    except ValueError as e:
        raise ConfigError([f"spec.drafter={shown(directory)!r}: {e}"]) from None


def _layout_problem(cfg: DraftConfig, stored: dict[str, tuple[int, ...]]) -> str | None:
    """Why stored tensors of these names and shapes do not load into the drafter `cfg` describes, found from the
    header. fp8 matrices are stored as codes of the parameter's shape + one scale per row (key + SCALE)."""
    from synodic.config.files import layout_problem
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in DraftModel(cfg).state_dict().items()}
    expect = {**want, **{k + SCALE: want[k][:1] for k in want if k + SCALE in stored}}
    return layout_problem(expect, stored, f"{cfg.scheme} drafter config.json describes")


def check_fit(cfg: DraftConfig, target_cfg, directory, model_kind: str | None = None) -> None:
    """ConfigError (one line) when the drafter in `directory` (its config `cfg`) was trained for another target:
    another model kind (when both are known: a drafter reading another model's features loads but accepts
    nothing), vocabulary, hidden size, or target blocks past this model's depth. Needs only the target's config,
    so the graph checks it before the target loads."""
    from synodic.config.files import shown
    key = f"spec.drafter={shown(Path(directory))!r}"
    if cfg.target_kind and model_kind and cfg.target_kind != model_kind:
        raise ConfigError([f"{key}: trained for model={cfg.target_kind}, this run's is model={model_kind}; expected "
                           f"a drafter trained for model={model_kind} (spec.drafter=auto picks the shipped one)"])
    blocks = num_target_blocks(target_cfg)
    for name, mine, theirs in (("vocab_size", cfg.vocab_size, target_cfg.vocab_size),
                               ("hidden_size", cfg.hidden_size, target_cfg.hidden_size)):
        if mine != theirs:
            raise ConfigError([f"{key}: trained for a target with {name}={mine}, this model has {name}={theirs}; "
                               "expected a drafter trained for this model"])
    if max(cfg.target_layers) >= blocks:
        raise ConfigError([f"{key}: reads target blocks {list(cfg.target_layers)}, this model has {blocks} blocks; "
                           f"expected target_layers below {blocks} (a drafter trained for this model)"])


def load_draft_model(directory, target_cfg, device="cpu", dtype=torch.float32, target=None) -> DraftModel:
    """The drafter saved in `directory`, checked against `target_cfg`; ConfigError (one line) when the directory or
    a file is missing or the drafter was trained for another vocabulary / hidden size / depth."""
    from synodic.config.files import shown
    d = Path(directory)
    key = f"spec.drafter={shown(d)!r}"
    cfg = check_drafter_dir(d)
    check_fit(cfg, target_cfg, d)
    with torch.device("meta"):
        model = DraftModel(cfg)
    try:
        state = _dequantized(load_file(str(d / WEIGHTS), device=str(device)))
    except Exception as e:  # a truncated / foreign file: one line naming it
        raise ConfigError([f"{key}: {WEIGHTS} is not a drafter's weights ({str(e).splitlines()[0]}); expected "
                           f"the {WEIGHTS} pipeline=train_drafter writes"]) from None
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
                          assign=True, strict=True)
    model = model.to(device=device, dtype=dtype)
    if cfg.scheme == "dspark":  # calibration temperatures stay fp32 whatever the run's dtype
        model.confidence.temperature = model.confidence.temperature.float()
    return model.bind_target(target) if target is not None else model


def shipped_drafter_dir(target_kind: str, scheme: str) -> Path | None:
    d = ASSETS / target_kind / scheme
    return d if (d / WEIGHTS).is_file() and (d / "config.json").is_file() else None


def shipped_drafters() -> list[str]:
    """'<target>/<scheme>' of every shipped drafter (for error messages)."""
    if not ASSETS.is_dir():
        return []
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in ASSETS.glob(f"*/*/{WEIGHTS}"))
