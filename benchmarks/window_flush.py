"""The pre-window flush of a Mamba-2 replay cache (`mamba2_replay_flush(min_room=T)`, run by every verify window of
the engine) by fold: serial rank-1 updates (one load latency per ring entry) against the whole ring folded as one
dot ("dot": fp32 FMA, "tf32x3": tensor cores, the default from 4096 rows: `head_group.flush_config`).

    python -m benchmarks.window_flush --out window_flush.json [--batches 32,128,256] [--share 0.25]

Shapes: nemotron_h_8b's Mamba-2 layer (H=128, P=64, N=128, G=8), fp32 checkpoint, ring L=16, T=4. A `share` of the
rows sit past the flush rule (cursor L - 1) and the others below it (cursor 4), as in a speculative batch whose
rows commit ~3 tokens a step. Each config is checked against the serial fold's checkpoint first, then timed in a
CUDA graph over fresh copies of the cursors (a flush resets them). `--tiny` runs the checks at small shapes (CPU
with TRITON_INTERPRET=1)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from synodic.kernels.mamba2_replay import mamba2_replay_alloc, mamba2_replay_flush
from synodic.kernels.replay_common import LaunchPlan
from synodic.kernels.timing import graph_us

from benchmarks._cli import out_file, positive_float, positive_ints

SHAPE = dict(H=128, P=64, N=128, G=8)
TINY = dict(H=4, P=20, N=24, G=2)
CONFIGS = [(32, 1, 8, None), (32, 1, 8, None, "dot"), (32, 1, 8, None, "tf32x3"), (64, 1, 4, None, "dot"),
           (64, 1, 4, None, "tf32x3"), (16, 1, 4, None, "dot")]  # (BLOCK_P, heads per program, warps, maxnreg, fold)


def _cache(batch: int, shape: dict, L: int, share: float, device: str):
    gen = torch.Generator(device=device).manual_seed(batch)
    c = mamba2_replay_alloc(batch, shape["H"], shape["P"], shape["N"], shape["G"], L, device=device)
    c["ckpt"].normal_(generator=gen).mul_(0.3)
    c["ring_x"].normal_(generator=gen)
    c["ring_dt"].uniform_(0.0, 0.3, generator=gen)
    c["ring_B"].normal_(generator=gen)
    wp = torch.full((batch,), 4, dtype=torch.int32, device=device)
    wp[: max(1, round(share * batch))] = L - 1
    c["write_pos"].copy_(wp)
    A = -(torch.rand(shape["H"], generator=gen, device=device) + 0.3)
    return c, A, torch.arange(batch, dtype=torch.int32, device=device)


def _flush(c, A, sid, L, T, cfg) -> None:
    mamba2_replay_flush(**c, A=A, slot_ids=sid, L=L, min_room=T, backend="triton", plan=LaunchPlan(config=cfg))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default=Path("window_flush.json"))
    ap.add_argument("--batches", type=positive_ints, default="32,128,256")
    ap.add_argument("--share", type=positive_float, default=0.25, help="rows whose ring the flush folds")
    ap.add_argument("--tiny", action="store_true", help="small shapes, checks only (CPU: TRITON_INTERPRET=1)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("the flush kernels need a CUDA GPU; on the CPU: TRITON_INTERPRET=1 python -m benchmarks.window_flush "
                 "--tiny (checks only)")
    cuda = torch.cuda.is_available() and not a.tiny
    device, shape, L, T = ("cuda" if cuda else "cpu"), (SHAPE if cuda else TINY), 16, 4
    batches = a.batches if cuda else [3]
    configs = CONFIGS if cuda else [(16, 1, 4, None), (16, 1, 4, None, "dot"), (16, 1, 4, None, "tf32x3")]
    rows = []
    for batch in batches:
        c, A, sid = _cache(batch, shape, L, a.share, device)
        ref = {k: v.clone() for k, v in c.items()}
        _flush(ref, A, sid, L, T, configs[0])
        for cfg in configs:
            cc = {k: v.clone() for k, v in c.items()}
            _flush(cc, A, sid, L, T, cfg)
            err = ((cc["ckpt"] - ref["ckpt"]).abs().max() / ref["ckpt"].abs().max()).item()
            ok = err <= 1e-5 and torch.equal(cc["write_pos"], ref["write_pos"])
            row = dict(batch=batch, config=list(cfg), fold=cfg[4] if len(cfg) > 4 else "serial", rel_err=err, ok=ok)
            if cuda and ok:
                wp0 = c["write_pos"].clone()

                def step(cc=cc, cfg=cfg, wp0=wp0, A=A, sid=sid):
                    cc["write_pos"].copy_(wp0)  # (the flush resets the cursors it fires on)
                    _flush(cc, A, sid, L, T, cfg)
                row["us_graph"] = graph_us(step)
                fired = round(a.share * batch) * shape["H"] * shape["P"] * shape["N"] * 4
                row["state_GBps"] = 2 * fired / (row["us_graph"] * 1e3)  # the folded rows' checkpoints, read + written
            rows.append(row)
            print(f"b={batch} {row['fold']:7s} {str(cfg):32s} err {err:.1e} "
                  + (f"{row['us_graph']:8.1f} us {row['state_GBps']:6.0f} GB/s" if "us_graph" in row else
                     ("ok" if ok else "MISMATCH")), flush=True)
        a.out.write_text(json.dumps({"shape": shape, "L": L, "T": T, "share": a.share, "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
