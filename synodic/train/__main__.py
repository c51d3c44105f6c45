"""Standalone training without Hydra (e.g. on a machine without it):

    python -m synodic.train model=tiny_gdn out=outputs/train_gdn max_steps=2000 batch_size=32 \
        [overrides='{"hidden_size": 128}'] [any TrainPipeline field=value ...]

Values are parsed as JSON where they parse (numbers, lists, null), else taken as strings. Writes
results.json, metrics.csv, loss.png, checkpoint/ and model/ under `out`.
"""
import json
import sys
from pathlib import Path


def _value(v: str):
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def main(argv: list[str]) -> int:
    from synodic.config.argv import one_line_errors, parse_kv
    from synodic.models.config import HybridConfig
    from synodic.models.presets import PRESETS
    from synodic.train.config import TrainPipeline
    from synodic.train.trainer import train
    with one_line_errors(model=TrainPipeline):
        return _main(parse_kv(argv, __doc__, TrainPipeline), PRESETS, HybridConfig, TrainPipeline, train)


def _check_fits(arch, s, preset: str) -> None:
    """run.py's memory estimate for training (synodic/config/budget.py), refused in one line before the model is
    built: an 8B preset in fp32 with AdamW does not fit a workstation."""
    import torch

    from synodic.config import budget
    from synodic.train.config import default_batch
    dev = s.device if s.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    have = budget.available_bytes(torch.device(dev))
    est = budget.train_estimate(arch, s, dev, f"model={preset}", limit=int(0.9 * have), prefix="")
    budget.refuse_if_over(est, have, 0.9, dev, lambda key: s.batch_size or default_batch(dev))


def _main(kv, PRESETS, HybridConfig, TrainPipeline, train) -> int:
    from synodic.config.errors import ConfigError
    preset = kv.pop("model", "tiny_mamba2")
    out = Path(kv.pop("out", f"outputs/train_{preset}"))
    if preset not in PRESETS:
        raise ConfigError([f"model={preset!r}: expected one of {', '.join(sorted(PRESETS))}"])
    from synodic.config.files import writable_dir_problem
    why = "an empty path; expected a directory" if not str(out).strip() else writable_dir_problem(out)
    if why:
        raise ConfigError([f"out={str(out)!r}: {why}"])
    overrides = _value(kv.pop("overrides", "{}"))
    if not isinstance(overrides, dict):
        raise ConfigError([f"overrides={overrides!r}: expected a JSON object of HybridConfig fields"])
    values = {k: _value(v) for k, v in kv.items()}
    from synodic.config.registry import seed_problems
    if seed_problems(values):
        raise ConfigError(seed_problems(values))
    s = TrainPipeline.model_validate(values)
    from pydantic import ValidationError

    from synodic.config.errors import format_validation_error
    try:
        arch = HybridConfig.model_validate({**PRESETS[preset].model_dump(), **overrides})
    except ValidationError as e:  # name the key as given: overrides.<field>
        raise ConfigError([f"overrides.{line}" for line in format_validation_error(e, model=HybridConfig)]) from None
    _check_fits(arch, s, preset)
    res = train(s, out, arch)
    res["config"] = {"model": preset, "overrides": overrides, "pipeline": s.model_dump(mode="json")}
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
