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
           "shipped_drafter_dir", "shipped_drafters", "default_target_layers", "num_target_blocks"]

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


def save_draft_model(model: DraftModel, directory, matrix_dtype=torch.bfloat16) -> Path:
    """config.json + model.safetensors; matrices stored in `matrix_dtype` (bf16 keeps a file under 16 MiB),
    vectors (norms, conv base kernels, calibration temperatures) in fp32."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.config.model_dump_json(indent=2) + "\n")
    state = {k: (v.detach().to(matrix_dtype) if v.dim() >= 2 and v.is_floating_point() else v.detach().float()
                 if v.is_floating_point() else v.detach()).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    return out


def load_draft_model(directory, target_cfg, device="cpu", dtype=torch.float32, target=None) -> DraftModel:
    """The drafter saved in `directory`, checked against `target_cfg`; ConfigError (one line) when the directory or
    a file is missing or the drafter was trained for another vocabulary / hidden size / depth."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError([f"spec.drafter={str(d)!r}: no such directory (expected config.json + {WEIGHTS})"])
    for f in ("config.json", WEIGHTS):
        if not (d / f).is_file():
            raise ConfigError([f"spec.drafter={str(d)!r}: missing {f} (expected config.json + {WEIGHTS})"])
    try:
        cfg = DraftConfig.model_validate(json.loads((d / "config.json").read_text()))
    except Exception as e:  # malformed JSON or fields: one line naming the file
        raise ConfigError([f"spec.drafter={str(d)!r}: config.json is not a drafter config "
                           f"({str(e).splitlines()[0]})"]) from None
    blocks = num_target_blocks(target_cfg)
    for key, mine, theirs in (("vocab_size", cfg.vocab_size, target_cfg.vocab_size),
                              ("hidden_size", cfg.hidden_size, target_cfg.hidden_size)):
        if mine != theirs:
            raise ConfigError([f"spec.drafter={str(d)!r}: trained for a target with {key}={mine}, this model has "
                               f"{key}={theirs}"])
    if max(cfg.target_layers) >= blocks:
        raise ConfigError([f"spec.drafter={str(d)!r}: reads target blocks {list(cfg.target_layers)}, this model "
                           f"has {blocks} blocks"])
    with torch.device("meta"):
        model = DraftModel(cfg)
    state = load_file(str(d / WEIGHTS), device=str(device))
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
