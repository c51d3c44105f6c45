"""SPS profile for DSpark's load-aware verify (synodic/spec/load_aware.py): the target's verify step
(ModelRunner.speculate over windows of 1 + γ staged tokens on prefilled slots, a CUDA graph per batch on a GPU)
timed at a range of batch-token counts; writes synodic/assets/sps/<model>-<device>.json, which spec=dspark
spec.verify=load_aware finds by model and device name. Run once per model and device.

    python -m benchmarks.sps_profile model=tiny_mamba2 [runtime.device=cuda] [--tokens 8,16,...] [--reps 5]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def profile(overrides: list[str], tokens: list[int], window: int = 8, context: int = 32, reps: int = 5):
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.graph import build_graph
    from synodic.spec.load_aware import SpsProfile, device_name
    from synodic.spec.runtime import Drafter
    cfg = compose(overrides)
    rows = max(1, max(tokens) // window)
    eng = Engine(build_graph(cfg, max_seq_len=context + window + 1, max_slots=rows, window=window))
    run, dev = eng.runner, eng.runner.device
    V = eng.graph.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    slots = list(range(rows))
    for s in slots:
        run.prefill_batch([s], [torch.randint(0, V, (context,), generator=g).tolist()])
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sps = []
    for n in tokens:
        b = max(1, n // window)
        win = torch.randint(0, V, (b, window), generator=g).to(dev)
        times = []
        for i in range(reps + 1):
            sync()
            t = time.perf_counter()
            # what a load-aware step runs: the captured step with its drafts staged (random drafts: ~nothing is
            # accepted, and every repeat verifies at the same positions)
            run.speculate(Drafter(), slots[:b], [context] * b, win[:, 0].tolist(), window - 1, context + window,
                          win[:, 1:], [window - 1] * b)
            sync()
            if i:  # the first is warm-up
                times.append(time.perf_counter() - t)
        sps.append(1.0 / statistics.median(times))
    return SpsProfile([max(1, n // window) * window for n in tokens], sps, cfg.model.kind, device_name(dev))


def main(argv=None) -> None:
    from synodic.spec.load_aware import SPS_DIR, profile_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., runtime.device=...)")
    ap.add_argument("--tokens", default="8,16,32,64,128,256,512")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    tokens = sorted({int(t) for t in a.tokens.split(",")})
    prof = profile(list(a.overrides), tokens, reps=a.reps)
    SPS_DIR.mkdir(parents=True, exist_ok=True)
    path = profile_file(prof.model, prof.device)
    prof.save(path)
    print(f"{path}: " + ", ".join(f"{n} tok {s:.1f}/s" for n, s in zip(prof.tokens, prof.steps_per_s)))


if __name__ == "__main__":
    main()
