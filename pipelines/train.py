"""pipeline=train: train the `model` group's preset (+ model.overrides) from a seeded init on the
stdlib corpus or pipeline.data; checkpoints + resume, held-out eval, loss curve in the run dir.

    python run.py pipeline=train model=tiny_gdn pipeline.max_steps=1380
"""
from pathlib import Path

from synodic.train.config import TrainPipeline  # noqa: F401  (registers pipeline=train)


def run(cfg, run_dir: Path) -> dict:
    from synodic.models.config import HybridConfig
    from synodic.models.presets import PRESETS
    from synodic.train.trainer import train

    p = cfg.pipeline
    if p.device == "auto" and cfg.runtime.device != "auto":
        p = p.model_copy(update={"device": cfg.runtime.device})
    arch = HybridConfig.model_validate({**PRESETS[cfg.model.kind].model_dump(), **cfg.model.overrides})
    out = train(p, run_dir, arch)
    out["metrics"] = {k: v for k, v in out["metrics"].items() if v is not None}
    return out
