"""Checkpoints: synodic's own (`config.json` = HybridConfig + `model.safetensors` + optional `tokenizer.json`)
or a Hugging Face folder (synodic/models/hf: nemotron_h / qwen3_next config.json, sharded safetensors)."""
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import HybridConfig
from .lm import HybridLM, indexer_last

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "models"


def shipped_dir(preset: str) -> Path | None:
    d = ASSETS / preset
    return d if (d / "model.safetensors").is_file() else None


def save_checkpoint(model: HybridLM, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.config.model_dump_json(indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"))
    return out


def load_config(ckpt_dir: str | Path) -> HybridConfig:
    from .hf import CheckpointError, hf_config, is_hf_folder
    if not (Path(ckpt_dir) / "config.json").is_file():
        raise CheckpointError(f"{ckpt_dir} has no config.json; expected a synodic checkpoint or a Hugging Face "
                              "folder (config.json + safetensors shards)")
    if is_hf_folder(ckpt_dir):
        return hf_config(ckpt_dir)
    return HybridConfig.model_validate_json((Path(ckpt_dir) / "config.json").read_text())


def load_checkpoint(ckpt_dir: str | Path, device="cpu", dtype=torch.float32, progress: bool = True) -> HybridLM:
    """A synodic checkpoint directory or a Hugging Face folder (streamed shard by shard onto `device`)."""
    from .hf import is_hf_folder, load_hf
    if is_hf_folder(ckpt_dir):
        return load_hf(ckpt_dir, device, dtype, progress)
    cfg = load_config(ckpt_dir)
    st = Path(ckpt_dir) / "model.safetensors"
    from synodic.config.files import safetensors_header

    from .hf import CheckpointError
    try:  # the config-time check (files.py checkpoint_problems) again, for callers that skip validation
        why = layout_problem(cfg, {k: shape for k, (_, shape) in safetensors_header(st).items()}, st)
    except (OSError, ValueError) as e:
        why = f"{st} cannot be read ({e}); expected a complete safetensors file"
    if why:
        raise CheckpointError(why)
    with torch.device("meta"):
        model = HybridLM(cfg)
    state = load_file(str(st), device=str(device))
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(device=device, dtype=dtype)


def layout_problem(cfg: HybridConfig, shapes: dict[str, tuple[int, ...]], where) -> str | None:
    """Why tensors of these names and shapes (a safetensors header) do not fill the model `cfg` describes, or
    None: compared with the model built on the meta device, so no tensor data is read."""
    from synodic.config.files import layout_problem as mismatch
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in HybridLM(cfg).state_dict().items()}
    if cfg.tie_word_embeddings:  # the head is the embedding: saved once, and a stored copy is ignored at load
        want.pop("lm_head.weight", None)
        shapes = {k: v for k, v in shapes.items() if k != "lm_head.weight"}
    why = mismatch(want, shapes, f"{cfg.model_type} model config.json describes")
    return f"{where}: {why}" if why else None


def random_model(cfg: HybridConfig, seed: int, device="cpu", dtype=torch.float32) -> HybridLM:
    """Deterministic random weights from `seed` (built on the CPU for tiny models so every machine
    gets the same numbers; big presets are built on the target device)."""
    small = sum(p.numel() for p in _shapes(cfg)) < 50_000_000
    build_dev = "cpu" if small else device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # big presets are built in their dtype: an fp32 copy of an 8B model first would need 32 GB
        build_dtype = torch.float32 if small else dtype
        prev = torch.get_default_dtype()
        torch.set_default_dtype(build_dtype)
        try:
            with torch.device(build_dev):
                model = HybridLM(cfg)
        finally:
            torch.set_default_dtype(prev)
        if small:
            model.init_weights(seed)
        else:
            _init_on_device(model, seed)
    return model.to(device=device, dtype=dtype)


def _shapes(cfg: HybridConfig):
    with torch.device("meta"):
        return list(HybridLM(cfg).parameters())


def _init_on_device(model: HybridLM, seed: int) -> None:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, p in indexer_last(model.named_parameters()):
            if p.dim() >= 2 and "conv1d" not in name:
                p.normal_(0, std, generator=g)
