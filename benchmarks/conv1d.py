"""Benchmark of the causal-conv decode step (`conv1d_update`) on the GPU: the conv state stored channel-major
([slots, C, width - 1], each channel's window contiguous: 6-byte bf16 spans) vs tap-major (`new_conv_state`, each
tap a contiguous channel vector, the SSM backends' layout), same kernel, same inputs, CUDA-graph replays.

    python -m benchmarks.conv1d --out conv1d.json [--shapes 1x10240,8x10240,256x10240,256x8192]

Shapes are batch x channels (10240: nemotron_h_8b's Mamba-2 conv, 8192: qwen35_gdn_4b's GDN conv), width 4,
bf16. Reports µs, GB/s of the bytes the step moves (state read + write, x, out) against the H200 copy
rate (docs/measuring.md), and whether both layouts give bitwise-equal states and outputs.
"""
from __future__ import annotations

import argparse
import json

import torch
from synodic.kernels.conv1d_update import conv1d_update, new_conv_state
from synodic.kernels.timing import COPY_GBPS_H200, graph_us

from benchmarks._cli import out_file


def run_point(B: int, C: int, gen) -> dict:
    x = torch.randn(B, C, generator=gen).to("cuda", torch.bfloat16)
    cm = torch.randn(B + 1, C, 3, generator=gen).to("cuda", torch.bfloat16)
    tm = new_conv_state(B + 1, C, 3, dtype=torch.bfloat16, device="cuda")
    tm.copy_(cm)
    w = torch.randn(C, 4, generator=gen).to("cuda", torch.bfloat16)
    bias = torch.randn(C, generator=gen).to("cuda", torch.bfloat16)
    sid = torch.arange(B, device="cuda")
    equal = torch.equal(conv1d_update(x, cm, w, bias, sid), conv1d_update(x, tm, w, bias, sid)) and torch.equal(cm, tm)
    t_cm = graph_us(lambda: conv1d_update(x, cm, w, bias, sid))
    t_tm = graph_us(lambda: conv1d_update(x, tm, w, bias, sid))
    moved = B * C * (2 * 3 * 2 + 2 * 2)
    return dict(batch=B, channels=C, channel_major_us=t_cm, tap_major_us=t_tm, speedup=t_cm / t_tm,
                tap_major_gbs=moved / t_tm / 1e3, equal=equal)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=out_file, default="conv1d.json")
    ap.add_argument("--shapes", default="1x10240,8x10240,256x10240,256x8192")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_conv1d: needs a CUDA GPU (the kernel tests cover correctness on the CPU)")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for shape in a.shapes.split(","):
        B, C = (int(v) for v in shape.split("x"))
        r = run_point(B, C, gen)
        rows.append(r)
        print(f"batch {B:4d} x {C:6d} ch: channel-major {r['channel_major_us']:6.1f} µs, tap-major "
              f"{r['tap_major_us']:6.1f} µs ({r['speedup']:.2f}x; {r['tap_major_gbs']:5.0f} GB/s, "
              f"{100 * r['tap_major_gbs'] / COPY_GBPS_H200:4.1f} % of copy); equal {r['equal']}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "conv1d_update", "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
