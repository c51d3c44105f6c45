"""Where a speculative step's time goes: torch.profiler over one measured round of benchmarks.spec_decode's
setup (one model, batch and spec), printing the top ops by device and by host time, and kernels per step.

    python -m benchmarks.spec_profile --model tiny_mamba2 --spec dflash2 --batch 1 --out prof.txt"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.spec_decode import GPU, SMOKE, heldout_prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny_mamba2")
    ap.add_argument("--spec", default="dflash2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ssm", default="replay")
    ap.add_argument("--graphs", default="true")
    ap.add_argument("--out", type=Path, default=Path("spec_profile.txt"))
    a = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.engine.text import load_codec
    from synodic.graph import build_graph, checkpoint_dir
    p = dict(GPU if torch.cuda.is_available() else SMOKE)
    over = [f"model={a.model}", f"ssm={a.ssm}", f"spec={a.spec}", f"runtime.device={p['device']}",
            f"runtime.max_slots={a.batch}", f"runtime.cuda_graphs={a.graphs}"]
    cfg = compose(over)
    prompts = heldout_prompts(load_codec(checkpoint_dir(cfg.model)), a.batch, p["prompt_tokens"])
    eng = Engine(build_graph(cfg, max_seq_len=p["prompt_tokens"] + p["output_tokens"] + 16))

    def round_():
        eng.generate([Request(i, list(pr), SamplingParams(max_tokens=p["output_tokens"]))
                      for i, pr in enumerate(prompts)])
    round_()
    steps0 = eng.ledger.steps
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        round_()
    steps = eng.ledger.steps - steps0
    ka = prof.key_averages()
    dev_key = "device_time_total" if torch.cuda.is_available() else "cpu_time_total"
    text = [f"{' '.join(over)}: {steps} decode steps profiled",
            ka.table(sort_by=dev_key, row_limit=30), ka.table(sort_by="cpu_time_total", row_limit=30)]
    if torch.cuda.is_available():
        kernels = sum(e.count for e in ka if e.device_type.name == "CUDA")
        text.insert(1, f"device kernels: {kernels} ({kernels / max(steps, 1):.0f} per step)")
    a.out.write_text("\n".join(text))
    print("\n".join(text[:2]))


if __name__ == "__main__":
    main()
