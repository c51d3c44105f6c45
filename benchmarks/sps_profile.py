"""SPS profile for DSpark's load-aware verify (synodic/spec/load_aware.py): the target's verify step
(ModelRunner.speculate over windows of 1 + γ staged tokens on prefilled slots, a CUDA graph per batch on a GPU)
timed at a range of batch-token counts, and per batch (tokens / 8 rows) the two rates DraftGate weighs: a plain
decode step (queued back to back, as the overlapped loop runs them) and the load-aware draft step (the DSpark
drafter's graph, the read-back of its confidences and the length choice). Writes
synodic/assets/sps/<model>-<device>.json, which spec=dspark spec.verify=load_aware finds by model and device name.
Run once per model and device (the drafter is spec=dspark's shipped one unless overrides say otherwise).

    python -m benchmarks.sps_profile model=tiny_mamba2 [runtime.device=cuda] [--tokens 8,16,...] [--reps 5]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks._cli import compose_or_exit, positive_int, positive_ints


def profile(overrides: list[str], tokens: list[int], window: int = 8, context: int = 32, reps: int = 5):
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.graph import build_graph
    from synodic.spec.load_aware import SpsProfile, device_name
    from synodic.spec.runtime import Drafter
    if not any(o.startswith("spec=") for o in overrides):
        overrides = [*overrides, "spec=dspark"]
    cfg = compose(overrides)
    rows = max(1, max(tokens) // window)
    eng = Engine(build_graph(cfg, max_seq_len=context + window + 1, max_slots=rows, window=window))
    run, dev, drafter = eng.runner, eng.runner.device, eng.drafter
    verifier = drafter if drafter is not None else Drafter()  # (a verify commits to the drafter's context ring)
    V = eng.graph.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    slots = list(range(rows))
    for s in slots:
        ctx = torch.randint(0, V, (context,), generator=g).tolist()
        run.prefill_batch([s], [ctx])
        if drafter is not None:
            drafter.on_prefill([_Slot(s)], run.hidden if run.hidden_layers else None)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(step, *args, queued: int = 1, **kw) -> float:
        """Steps per second: the median of reps timings of `queued` steps launched back to back, then a sync."""
        times = []
        for i in range(reps + 1):
            sync()
            t = time.perf_counter()
            for _ in range(queued):
                step(*args, **kw)
            sync()
            if i:  # the first is warm-up (and capture)
                times.append((time.perf_counter() - t) / queued)
        return 1.0 / statistics.median(times)

    def draft_step(rows, anchors):  # what a load-aware step runs before its verify
        _, conf = run.draft(drafter, rows, [context] * len(rows), anchors, window - 1, context + window)
        drafter.lengths(conf)

    sps, batches, plain, draft = [], [], [], []
    for n in tokens:
        b = max(1, n // window)
        win = torch.randint(0, V, (b, window), generator=g).to(dev)
        anchors = win[:, 0].tolist()
        # what a load-aware step verifies: the captured step with its drafts staged (random drafts: ~nothing is
        # accepted, and every repeat verifies at the same positions)
        sps.append(timed(run.speculate, verifier, slots[:b], [context] * b, anchors, window - 1, context + window,
                         win[:, 1:], [window - 1] * b))
        batches.append(b)
        plain.append(timed(run.decode, slots[:b], [context] * b, anchors, context + 1, queued=8,
                           ring=drafter if run.hidden_layers else None))
        if drafter is not None and hasattr(drafter, "draft_confident"):
            probe = drafter.sps is None
            if probe:  # lengths() needs a profile: the verify rates measured so far price it
                drafter.sps = SpsProfile([max(1, m // window) * window for m in tokens[:len(sps)]], sps)
            draft.append(timed(draft_step, slots[:b], anchors))
            if probe:
                drafter.sps = None
    prof = SpsProfile([max(1, n // window) * window for n in tokens], sps, cfg.model.kind, device_name(dev))
    if len(draft) == len(batches):
        prof.batches, prof.plain_steps_per_s, prof.draft_steps_per_s = batches, plain, draft
    return prof


class _Slot:
    """What a drafter's on_prefill reads of a request: its slot."""

    def __init__(self, slot: int):
        self.slot = slot


def main(argv=None) -> None:
    from synodic.spec.load_aware import SPS_DIR, profile_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., runtime.device=...)")
    ap.add_argument("--tokens", type=positive_ints, default="8,16,32,64,128,256,512")
    ap.add_argument("--reps", type=positive_int, default=5)
    a = ap.parse_args(argv)
    tokens = sorted(set(a.tokens))
    overrides = list(a.overrides)
    compose_or_exit(ap, overrides if any(o.startswith("spec=") for o in overrides) else [*overrides, "spec=dspark"])
    prof = profile(overrides, tokens, reps=a.reps)
    SPS_DIR.mkdir(parents=True, exist_ok=True)
    path = profile_file(prof.model, prof.device)
    prof.save(path)
    print(f"{path}: verify " + ", ".join(f"{n} tok {s:.1f}/s" for n, s in zip(prof.tokens, prof.steps_per_s)))
    if prof.gates:
        print("plain / draft steps/s by batch: " + ", ".join(
            f"{b}: {p:.1f} / {d:.1f}" for b, p, d in zip(prof.batches, prof.plain_steps_per_s, prof.draft_steps_per_s)))


if __name__ == "__main__":
    main()
