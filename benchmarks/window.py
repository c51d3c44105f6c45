"""Benchmark of the eager speculative-verify window kernels (the vLLM baseline) against the
ReplaySSM verify kernels, on the GPU.

    python -m benchmarks.window --out window.json [--T 4] [--batches 1,32,128,256]

Shapes (docs/measuring.md): Mamba-2 H=128, P=64, N=128, G=8 and GDN HV=32, Hk=16, K=V=128, fp32 state,
bf16 model tensors, window T = 1 + drafts = 4. First checks the window kernels against their torch
references at the real head shapes (padding row, a dst equal to its src) and, when the ReplaySSM
kernels exist, that `*_replay_verify` from an empty ring (write_pos 0) gives the same outputs.
Then per batch it times
  * eager window: one `*_decode_window` launch (read S once, write T states into the request's
    T = 1 + drafts slots), `triton.testing.do_bench` median (L2 flushed) and CUDA-graph replay
    (R launches on R disjoint slot sets per graph, time / R, slot sets rotated so the state touched
    per replay exceeds the L2). Bytes = read S + write T S + inputs + outputs.
  * replay verify (if `synodic.kernels.mamba2_replay` / `gdn_replay` import): `*_replay_flush(min_room=T)`
    + `*_replay_verify` with write_pos = L/2 = 8 in a ring of L = 16 (the flush does not fire), same
    timing; its bytes are an estimate (checkpoint + 8 ring entries read, T entries written, window
    inputs and outputs). The verify is the default impl ("auto": per-group for an fp32 checkpoint at >= 16384
    batch x heads, else per-head); the head-group kernel is timed as the extra variant
    "replay_verify_head_group" (verify alone, CUDA graph:
    `replay_verify_head_group_only_us_graph`).
    `--sweep` times (impl, config) launch configs of both at the given batches (VERIFY_SWEEP).
and prints the speedup replay/eager (= eager time / replay time, the faster of plain and graph for
each). Prints a markdown table, writes JSON (rewritten after every row, so a cut-short run keeps
what it measured). `--tiny` runs the checks and one call of every timed op at tiny shapes (also on
CPU, with TRITON_INTERPRET=1).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import math
import os
import platform
import sys

import torch
from synodic.kernels.replay_common import LaunchPlan
from synodic.kernels.timing import COPY_GBPS_H200, graph_us

from benchmarks._cli import out_file, positive_int, positive_ints
from benchmarks.ssm_decode import ROTATE_BYTES, _esize, rel_rmse, write_json
from synodic.results.env import git_commit

MAMBA = dict(H=128, P=64, N=128, G=8)
# (impl, config): per-head = (BLOCK, num_warps[, gram[, maxnreg]]) (gram: group / key-head dot products in a
# prologue kernel); head-group = (BLOCK, heads per program, num_warps, maxnreg)
# (impl, config); per-head config = (BLOCK, warps, gram[, maxnreg[, dot]]), group = (warps, stages[, head splits]):
# the candidates that were ever close to the default (the sweeps' losers, and their times, are in
# docs/tuning/replay.md).
VERIFY_SWEEP = {"mamba2": [("per_head", (64, 2, True)), ("per_head", (32, 2, True)),
                           ("per_head", (64, 2, True, None, True)),
                           ("per_head", (64, 4, True, None, True)), ("per_head", (32, 2, True, None, True)),
                           ("per_head", (64, 8, True, None, True)), ("per_head", (32, 4, True, None, True)),
                           ("group", (4, 3)), ("group", (4, 2)), ("group", (4, 2, 2))],
                "gdn": [("per_head", (32, 1, True, None, True)), ("per_head", (64, 2, True, None, True)),
                        ("per_head", (32, 1, True, 128, True)), ("per_head", (32, 1, True, 168, True)),
                        ("per_head", (32, 1, True, 255, True)), ("per_head", (64, 2, True, 128, True)),
                        ("per_head", (16, 1, True, None, True))]}
GDN = dict(HV=32, Hk=16, K=128, V=128)
TINY_MAMBA = dict(H=6, P=8, N=16, G=3)
TINY_GDN = dict(HV=4, Hk=2, K=16, V=8)
MODEL_DTYPE = torch.bfloat16
STATE_DTYPE = torch.float32
RING_L = 16
WRITE_POS = RING_L // 2
BENCH = dict(warmup=10, rep=100)


def _replay_module(name):
    try:
        if name == "mamba2":
            from synodic.kernels import mamba2_replay as m
            return m if hasattr(m, "mamba2_replay_verify") and hasattr(m, "mamba2_replay_flush") else None
        from synodic.kernels import gdn_replay as m
        return m if hasattr(m, "gdn_replay_verify") and hasattr(m, "gdn_replay_flush") else None
    except Exception:  # noqa: BLE001 - absent or broken: the eager numbers still stand
        return None


# ----------------------------------------------------------------------------------------------
# problems: R input sets each; call(r) runs one step on set r
# ----------------------------------------------------------------------------------------------
def _window_ids(batch, T, rot, device, gen):
    """Per set r: dst [batch, T] = the T slots of each request (1 + drafts), src = one of them
    (the last accepted position's slot). Sets use disjoint slots."""
    num_slots = batch * T * rot
    perm = torch.randperm(num_slots, device=device, generator=gen).to(torch.int32).view(rot, batch, T)
    pick = torch.randint(0, T, (rot, batch, 1), device=device, generator=gen)
    return num_slots, [(perm[r].gather(1, pick[r]).squeeze(1).contiguous(), perm[r].contiguous())
                       for r in range(rot)]


class MambaWindow:
    name = "mamba2"

    def __init__(self, shape, batch, T, rot, device, gen):
        H, P, N, G = (shape[k] for k in "HPNG")
        self.shape, self.batch, self.T = shape, batch, T
        num_slots, ids = _window_ids(batch, T, rot, device, gen)
        self.state = (torch.randn(num_slots, H, P, N, device=device, generator=gen) * 0.1).to(STATE_DTYPE)
        self.prm = dict(A=-torch.rand(H, device=device, generator=gen) * 2 - 0.1,
                        D=torch.randn(H, device=device, generator=gen),
                        dt_bias=torch.randn(H, device=device, generator=gen) * 0.5)
        self.sets = [dict(window_inputs(shape, batch, T, device, gen, "mamba2"), src_ids=s, dst_ids=d)
                     for s, d in ids]

    @staticmethod
    def slot_bytes(shape):
        return shape["H"] * shape["P"] * shape["N"] * _esize(STATE_DTYPE)

    def call(self, r, backend="triton"):
        from synodic.kernels.mamba2_window import mamba2_decode_window
        return mamba2_decode_window(self.state, **self.sets[r], **self.prm, backend=backend)

    def default_config(self):
        from synodic.kernels.mamba2_decode.head_group import default_config
        return default_config(STATE_DTYPE, self.shape["P"], self.shape["N"], self.batch * self.shape["H"])

    def bytes_moved(self):
        b, T, (H, P, N, G) = self.batch, self.T, (self.shape[k] for k in "HPNG")
        e, es = _esize(MODEL_DTYPE), _esize(STATE_DTYPE)
        state = (1 + T) * b * H * P * N * es
        inputs = b * T * (H * P * e + H * 4 + 2 * G * N * e) + 3 * H * 4 + b * 4 + b * T * 4
        return state, inputs + b * T * H * P * e  # + y


class GDNWindow:
    name = "gdn"

    def __init__(self, shape, batch, T, rot, device, gen):
        HV, K, V = shape["HV"], shape["K"], shape["V"]
        self.shape, self.batch, self.T = shape, batch, T
        num_slots, ids = _window_ids(batch, T, rot, device, gen)
        self.state = (torch.randn(num_slots, HV, V, K, device=device, generator=gen) * 0.1).to(STATE_DTYPE)
        self.sets = [dict(window_inputs(shape, batch, T, device, gen, "gdn"), src_ids=s, dst_ids=d)
                     for s, d in ids]

    @staticmethod
    def slot_bytes(shape):
        return shape["HV"] * shape["V"] * shape["K"] * _esize(STATE_DTYPE)

    def call(self, r, backend="triton"):
        from synodic.kernels.gdn_window import gdn_decode_window
        return gdn_decode_window(self.state, **self.sets[r], backend=backend)

    def default_config(self):
        from synodic.kernels.gdn_decode.head_group import default_config
        return default_config(STATE_DTYPE, self.shape["V"], self.shape["K"], self.batch * self.shape["HV"])

    def bytes_moved(self):
        b, T, (HV, Hk, K, V) = self.batch, self.T, (self.shape[k] for k in ("HV", "Hk", "K", "V"))
        e, es = _esize(MODEL_DTYPE), _esize(STATE_DTYPE)
        state = (1 + T) * b * HV * V * K * es
        inputs = b * T * (2 * Hk * K * e + HV * V * e + 2 * HV * 4) + b * 4 + b * T * 4
        return state, inputs + b * T * HV * V * e  # + o


def window_inputs(shape, batch, T, device, gen, kind):
    def rnd(*s):
        return torch.randn(*s, device=device, generator=gen)

    if kind == "mamba2":
        H, P, N, G = (shape[k] for k in "HPNG")
        return dict(x=rnd(batch, T, H, P).to(MODEL_DTYPE), dt=rnd(batch, T, H) * 0.7 - 1.0,
                    B=rnd(batch, T, G, N).to(MODEL_DTYPE), C=rnd(batch, T, G, N).to(MODEL_DTYPE))
    HV, Hk, K, V = (shape[k] for k in ("HV", "Hk", "K", "V"))
    return dict(q=rnd(batch, T, Hk, K).to(MODEL_DTYPE), k=rnd(batch, T, Hk, K).to(MODEL_DTYPE),
                v=rnd(batch, T, HV, V).to(MODEL_DTYPE),
                g=torch.nn.functional.logsigmoid(rnd(batch, T, HV) + 2), beta=torch.sigmoid(rnd(batch, T, HV)))


class Replay:
    """ReplaySSM verify (+ the pre-window flush check) on the same shapes, write_pos = L/2."""

    def __init__(self, kind, shape, batch, T, rot, device, gen, with_flush=True):
        self.kind, self.shape, self.batch, self.T, self.with_flush = kind, shape, batch, T, with_flush
        self.mod = _replay_module(kind)
        slots = batch * rot
        L = RING_L
        if kind == "mamba2":
            H, P, N, G = (shape[k] for k in "HPNG")
            self.cache = self.mod.mamba2_replay_alloc(slots, H, P, N, G, L, dtype=MODEL_DTYPE,
                                                      ckpt_dtype=STATE_DTYPE, device=device)
            c = self.cache
            c["ckpt"].copy_(torch.randn(c["ckpt"].shape, device=device, generator=gen) * 0.1)
            c["ring_x"].copy_(torch.randn(c["ring_x"].shape, device=device, generator=gen))
            c["ring_dt"].copy_(torch.rand(c["ring_dt"].shape, device=device, generator=gen) * 0.5)
            c["ring_B"].copy_(torch.randn(c["ring_B"].shape, device=device, generator=gen))
            self.prm = dict(A=-torch.rand(H, device=device, generator=gen) * 2 - 0.1,
                            D=torch.randn(H, device=device, generator=gen),
                            dt_bias=torch.randn(H, device=device, generator=gen) * 0.5)
        else:
            HV, Hk, K, V = (shape[k] for k in ("HV", "Hk", "K", "V"))
            self.cache = self.mod.gdn_replay_alloc(slots, HV, V, K, Hk, L, dtype=MODEL_DTYPE,
                                                   ckpt_dtype=STATE_DTYPE, device=device)
            c = self.cache
            c["ckpt"].copy_(torch.randn(c["ckpt"].shape, device=device, generator=gen) * 0.1)
            c["ring_u"].copy_(torch.randn(c["ring_u"].shape, device=device, generator=gen) * 0.1)
            rk = torch.randn(c["ring_k"].shape, device=device, generator=gen)
            c["ring_k"].copy_(rk / rk.norm(dim=-1, keepdim=True))
            c["ring_g"].copy_(torch.nn.functional.logsigmoid(
                torch.randn(c["ring_g"].shape, device=device, generator=gen) + 2))
            self.prm = {}
        c["write_pos"].fill_(WRITE_POS)
        perm = torch.randperm(slots, device=device, generator=gen).to(torch.int32)
        self.sets = [dict(window_inputs(shape, batch, T, device, gen, kind),
                          slot_ids=perm[r * batch:(r + 1) * batch].contiguous()) for r in range(rot)]

    def call(self, r, backend="auto"):
        s, c, L = self.sets[r], self.cache, RING_L
        if self.kind == "mamba2":
            if self.with_flush:
                self.mod.mamba2_replay_flush(**c, A=self.prm["A"], slot_ids=s["slot_ids"], L=L, min_room=self.T,
                                             backend=backend)
            return self.mod.mamba2_replay_verify(**c, **s, **self.prm, L=L, backend=backend,
                                                 plan=LaunchPlan(config=getattr(self, "config", None),
                                                                 impl=getattr(self, "impl", "auto")))
        if self.with_flush:
            self.mod.gdn_replay_flush(**c, slot_ids=s["slot_ids"], L=L, min_room=self.T, backend=backend)
        return self.mod.gdn_replay_verify(**c, **s, L=L, backend=backend,
                                          plan=LaunchPlan(config=getattr(self, "config", None), impl=getattr(self,
                                                          "impl", "auto")))

    def bytes_est(self):
        b, T, wp, e = self.batch, self.T, WRITE_POS, _esize(MODEL_DTYPE)
        if self.kind == "mamba2":
            H, P, N, G = (self.shape[k] for k in "HPNG")
            ckpt = b * H * P * N * _esize(STATE_DTYPE)
            entry = H * P * e + H * 4 + G * N * e
            io = b * T * (H * P * e + H * 4 + 2 * G * N * e) + b * T * H * P * e
        else:
            HV, Hk, K, V = (self.shape[k] for k in ("HV", "Hk", "K", "V"))
            ckpt = b * HV * V * K * _esize(STATE_DTYPE)
            entry = HV * V * e + Hk * K * e + HV * 4
            io = b * T * (2 * Hk * K * e + HV * V * e + 2 * HV * 4) + b * T * HV * V * e
        return ckpt + b * (wp + T) * entry + io + 2 * b * 4


# ----------------------------------------------------------------------------------------------
def time_plain(p, rot):
    import triton.testing

    it = [0]

    def fn():
        p.call(it[0] % rot)
        it[0] += 1

    return triton.testing.do_bench(fn, return_mode="median", **BENCH) * 1e3  # µs




def time_graph(p, rot):
    """Per-call time of one call per slot set (rot of them) in one CUDA graph."""
    return graph_us([functools.partial(p.call, r) for r in range(rot)], warmup_ms=10, rep_ms=100)


def check(cls, shape, T, device):
    """Window kernel vs reference at the real head shape: batch 3 (a padding row, row 0 writing its
    own src slot at t = 0), plus replay verify from an empty ring vs the window outputs."""
    gen = torch.Generator(device=device).manual_seed(0)
    p = cls(shape, 3, T, 1, device, gen)  # 3 T slots
    num_slots = p.state.shape[0]
    src = torch.tensor([0, -1, T], dtype=torch.int32, device=device)
    dst = torch.tensor([[0] + list(range(2 * T, 3 * T - 1)), [1] * T, list(range(T, 2 * T))],
                       dtype=torch.int32, device=device)
    p.sets[0].update(src_ids=src, dst_ids=dst)
    state0 = p.state.clone()
    y = p.call(0, "triton")
    s_tri, p.state = p.state, state0.clone()
    y_ref = p.call(0, "ref")
    written = set(dst[0].tolist()) | set(dst[2].tolist())
    untouched = all(torch.equal(s_tri[i], state0[i]) for i in range(num_slots) if i not in written)
    res = dict(kernel=f"{cls.name}_decode_window", T=T, rel_rmse_out=rel_rmse(y, y_ref),
               rel_rmse_state=rel_rmse(s_tri, p.state), padding_zero=bool((y[1] == 0).all()),
               untouched_slots_ok=untouched)
    tol_out = 4e-3  # ~1 ulp flips of the bf16 outputs
    ok = res["rel_rmse_out"] < tol_out and res["rel_rmse_state"] < 1e-5 and untouched and res["padding_zero"]
    mod = _replay_module(cls.name)
    if mod is not None:  # same window from an empty ring: the replay verify must give the same y
        try:
            rp = Replay(cls.name, shape, 3, T, 1, device, gen, with_flush=False)
            c = rp.cache
            c["write_pos"].zero_()
            ids = torch.tensor([0, -1, 2], dtype=torch.int32, device=device)
            c["ckpt"][0].copy_(state0[0])
            c["ckpt"][2].copy_(state0[T])
            inp = {k: v for k, v in p.sets[0].items() if k not in ("src_ids", "dst_ids")}
            rp.sets[0] = dict(inp, slot_ids=ids)
            if cls is MambaWindow:
                rp.prm = p.prm
            y_rp = rp.call(0, "triton" if device == "cuda" else "ref")
            res["rel_rmse_replay_vs_window"] = rel_rmse(y_rp, y)
            ok = ok and res["rel_rmse_replay_vs_window"] < 1e-2
            # per-head with the prologue (a batch of 3 picks one launch) and head-group, same window
            if device == "cuda":
                rp.config = (64, 2, True)
                res["rel_rmse_replay_gram_vs_window"] = rel_rmse(rp.call(0, "triton"), y)
                rp.config, rp.impl = None, "head_group"
                res["rel_rmse_replay_head_group_vs_window"] = rel_rmse(rp.call(0, "triton"), y)
                rp.impl = "auto"
                ok = (ok and res["rel_rmse_replay_head_group_vs_window"] < 1e-2
                      and res["rel_rmse_replay_gram_vs_window"] < 1e-2)
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the replay API is not ours
            res["replay_check_error"] = f"{type(exc).__name__}: {exc}"
    res["ok"] = ok
    return res


ADMIT_BUDGET = 64 * 2**30  # SSM-state memory budget of the admission comparison (bytes, all layers)
ADMIT_LAYERS = 24          # SSM layers of the nemotron_h_8b / qwen35_gdn_4b presets


def admission(kind, shape, T, L=RING_L, budget=ADMIT_BUDGET, layers=ADMIT_LAYERS):
    """Requests a fixed SSM-state budget admits while speculating with windows of T tokens: the eager
    baseline holds 1 + drafts = T full fp32 states per request and layer; replay one fp32 checkpoint
    plus its ring (+ a bf16 copy in dual precision). Bytes exact to the allocators' layouts."""
    def nbytes(c):
        return sum(t.numel() * t.element_size() for t in c.values())
    if kind == "mamba2":
        from synodic.kernels.mamba2_replay import mamba2_replay_alloc
        H, P, N, G = (shape[k] for k in "HPNG")
        state = H * P * N * _esize(STATE_DTYPE)
        replay = nbytes(mamba2_replay_alloc(1, H, P, N, G, L, dtype=MODEL_DTYPE, device="meta"))
        dual = nbytes(mamba2_replay_alloc(1, H, P, N, G, L, dtype=MODEL_DTYPE, lo_dtype=torch.bfloat16,
                                          device="meta"))
    else:
        from synodic.kernels.gdn_replay import gdn_replay_alloc
        HV, Hk, K, V = (shape[k] for k in ("HV", "Hk", "K", "V"))
        state = HV * V * K * _esize(STATE_DTYPE)
        replay = nbytes(gdn_replay_alloc(1, HV, V, K, Hk, L, dtype=MODEL_DTYPE, device="meta"))
        dual = nbytes(gdn_replay_alloc(1, HV, V, K, Hk, L, dtype=MODEL_DTYPE, lo_dtype=torch.bfloat16,
                                       device="meta"))
    per = {"eager_spec": T * state, "replay_fp32": replay, "replay_dual_bf16": dual}
    return dict(budget_bytes=budget, layers=layers, T=T, bytes_per_request_layer=per,
                admitted={k: budget // (layers * v) for k, v in per.items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=out_file, default="bench_window.json")
    ap.add_argument("--batches", type=positive_ints, default="1,32,128,256")
    ap.add_argument("--T", type=positive_int, default=4, help="window size 1 + drafts")
    ap.add_argument("--kinds", default="mamba2,gdn", help="layer kinds to time (checks and admission cover both)")
    ap.add_argument("--sweep", default="", help="batches at which to time the replay verify launch configs")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny shapes: checks + one call of every timed op, no timing (also on CPU)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda and not args.tiny:
        sys.exit("bench_window: needs a CUDA GPU (use --tiny for a CPU smoke test)")
    batches = args.batches
    sweep_batches = [int(b) for b in args.sweep.split(",") if b]
    T = args.T
    problems = [(MambaWindow, TINY_MAMBA if args.tiny else MAMBA), (GDNWindow, TINY_GDN if args.tiny else GDN)]
    import triton

    res = dict(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable), "-m", "benchmarks.window"]
                         + (argv if argv is not None else sys.argv[1:])),
        device=torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        git_commit=git_commit(), hbm_gbps_reference=COPY_GBPS_H200, model_dtype=str(MODEL_DTYPE),
        state_dtype=str(STATE_DTYPE), T=T, ring_L=RING_L, replay_write_pos=WRITE_POS,
        shapes=dict(mamba2=problems[0][1], gdn=problems[1][1]),
        replay_available={k: _replay_module(k) is not None for k in ("mamba2", "gdn")},
        checks=[], rows=[],
    )
    for cls, shape in problems:
        c = check(cls, shape, T, device)
        res["checks"].append(c)
        print(f"check {c['kernel']:20s} rel_rmse out {c['rel_rmse_out']:.2e} state {c['rel_rmse_state']:.2e} "
              f"replay-vs-window {c.get('rel_rmse_replay_vs_window', float('nan')):.2e} "
              f"(head-group {c.get('rel_rmse_replay_head_group_vs_window', float('nan')):.2e}) "
              f"{c.get('replay_check_error', '')} -> {'OK' if c['ok'] else 'FAIL'}", flush=True)

    res["admission"] = {cls.name: admission(cls.name, shape, T) for cls, shape in problems}
    for name, a in res["admission"].items():
        print(f"admission {name}: {a['budget_bytes'] / 2**30:.0f} GiB of SSM state, {a['layers']} layers, T={T}: "
              + ", ".join(f"{k} {v}" for k, v in a["admitted"].items()), flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - {"mamba2", "gdn"}:
        ap.error(f"--kinds {args.kinds!r}: expected a comma list of mamba2, gdn")
    for cls, shape in problems:
        if cls.name not in kinds:
            continue
        for batch in batches:
            # slot sets rotated so the state one graph replay touches exceeds the L2 several times
            rot = 1 if not cuda else max(1, math.ceil(ROTATE_BYTES / (batch * T * cls.slot_bytes(shape))))
            p = cls(shape, batch, T, rot, device, gen)
            state_b, other_b = p.bytes_moved()
            total = state_b + other_b
            blk, nw = p.default_config()
            row = dict(kernel=f"{cls.name}_decode_window", batch=batch, T=T, block=blk, num_warps=nw,
                       bytes=total, state_bytes=state_b, rotate=rot)
            rp = None
            if res["replay_available"][cls.name]:
                try:
                    rp = Replay(cls.name, shape, batch, T, rot, device, gen)
                    rv = Replay.__new__(Replay)
                    rv.__dict__.update(rp.__dict__, with_flush=False)  # verify alone, same tensors
                except Exception as exc:  # noqa: BLE001
                    row["replay_error"] = f"{type(exc).__name__}: {exc}"
                    rp = None
            if not cuda:  # smoke test: one call of each op
                p.call(0)
                if rp is not None:
                    rp.call(0)
                res["rows"].append(row)
                continue
            row["us"], row["us_graph"] = time_plain(p, rot), time_graph(p, rot)
            best = min(row["us"], row["us_graph"])
            row["gbps"] = total / (best * 1e3)
            row["pct_hbm"] = 100 * row["gbps"] / COPY_GBPS_H200
            msg = (f"{row['kernel']} b={batch}: {row['us']:.1f} µs, graph {row['us_graph']:.1f} µs, "
                   f"{row['gbps']:.0f} GB/s ({row['pct_hbm']:.1f} %)")
            if rp is not None:
                try:
                    row["replay_us"], row["replay_us_graph"] = time_plain(rp, rot), time_graph(rp, rot)
                    row["replay_verify_only_us_graph"] = time_graph(rv, rot)  # default impl ("auto")
                    rv.impl = "head_group"  # variant "replay_verify_head_group"
                    row["replay_verify_head_group_only_us_graph"] = time_graph(rv, rot)
                    rv.impl = "auto"
                    row["verify_default_speedup_over_head_group"] = (row["replay_verify_head_group_only_us_graph"]
                                                        / row["replay_verify_only_us_graph"])
                    if batch in sweep_batches:  # verify launch configs: (impl, config)
                        row["verify_sweep"] = []
                        for impl, cfg in VERIFY_SWEEP[cls.name]:
                            rv.impl, rv.config = impl, cfg
                            try:
                                us = time_graph(rv, rot)
                            except Exception as exc:  # noqa: BLE001 - e.g. out of resources: skip the config
                                us = None
                                print(f"  sweep {impl} {cfg}: {type(exc).__name__}: {exc}", flush=True)
                            row["verify_sweep"].append(dict(impl=impl, config=cfg, us_graph=us))
                        rv.impl, rv.config = "auto", None
                    rbest = min(row["replay_us"], row["replay_us_graph"])
                    row["replay_bytes_est"] = rp.bytes_est()
                    row["replay_gbps_est"] = row["replay_bytes_est"] / (rbest * 1e3)
                    row["speedup_replay_over_eager"] = best / rbest
                    row["replay_write_pos_ok"] = bool((rp.cache["write_pos"] == WRITE_POS).all())
                    msg += (f" | replay {rbest:.1f} µs -> speedup {row['speedup_replay_over_eager']:.2f}x"
                            f" | verify (default impl) {row['replay_verify_only_us_graph']:.1f} µs,"
                            f" head-group {row['replay_verify_head_group_only_us_graph']:.1f} µs")
                except Exception as exc:  # noqa: BLE001
                    row["replay_error"] = f"{type(exc).__name__}: {exc}"
                    msg += f" | replay error {row['replay_error']}"
            print(msg, flush=True)
            res["rows"].append(row)
            _write(res, args.out, quiet=True)
            del p, rp
            torch.cuda.empty_cache()
    _write(res, args.out)
    return 0 if all(c["ok"] for c in res["checks"]) else 1


def _write(res, path, quiet=False):
    lines = ["| kernel | batch | T | block, warps | µs | µs CUDA graph | bytes moved | GB/s | % of copy rate "
             "| replay flush+verify µs (graph) | replay verify µs (graph) | replay verify head-group µs (graph) "
             "| speedup replay/eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "us" not in r:
            continue
        rep = (f"{min(r['replay_us'], r['replay_us_graph']):.1f} ({r['replay_us_graph']:.1f}) "
               f"| {r['replay_verify_only_us_graph']:.1f} | {r['replay_verify_head_group_only_us_graph']:.1f} "
               f"| {r['speedup_replay_over_eager']:.2f}x"
               if "speedup_replay_over_eager" in r else "- | - | - | -")
        lines.append(f"| {r['kernel']} | {r['batch']} | {r['T']} | {r['block']}, {r['num_warps']} "
                     f"| {r['us']:.1f} | {r['us_graph']:.1f} | {r['bytes'] / 2**20:.2f} MiB "
                     f"| {r['gbps']:.0f} | {r['pct_hbm']:.1f} | {rep} |")
    res["table_md"] = "\n".join(lines)
    if not quiet:
        print("\n(GB/s, % and speedup use the faster of plain and CUDA-graph times)")
    write_json(res, path, quiet)


if __name__ == "__main__":
    sys.exit(main())
