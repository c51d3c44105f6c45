"""Benchmark of the ReplaySSM decode kernels against the eager decode kernels, one process.

    python -m benchmarks.replay --out replay.json [--batches 1,8,32,128,256,512] [--sweep]

Mamba-2 (H=128, P=64, N=128, G=8) and GDN (HV=32, Hk=16, K=V=128), L=16, bf16 activations.
Variants: eager fp32 state (``mamba2_decode`` / ``gdn_decode`` Triton kernels), replay fp32
checkpoint, replay dual_bf16 (fp32 checkpoint + bf16 copy read between flushes), and the same two
through the eager-shaped decode kernels ``impl="per_head"`` (rows ``*_per_head``, Mamba-2 and GDN adjoint:
``advance=False``, the
cursor is a per-step constant tensor, i.e. moved once per step outside the layer as in the engine;
per-head fused steps read all L ring entries, split ones the wp live ones; the byte count stays the needed bytes);
GDN replay in both routes.
``--stagger`` adds the per-head rows with staggered cursors (``*_per_head_stag``: slot s at cursor (s + i) mod L on
step i,
so 1/L of the rows flush on every step, as in steady-state serving, instead of all rows on one step of L);
``--flush-sweep`` times the split (dual) rows over flush launch configs (block, warps, fold, tiles per program);
``--overlap-sweep`` times them with the flush launch in order / beside the output-only launch (``overlap``);
``--split-sweep`` times the dual rows as one fused launch / a split step (``split``).
Every time is the average decode step over full L-step cycles (so the flush is amortised):
one CUDA graph holds L x R steps over R rotated slot sets (state touched per graph > 2x L2, and at least
``--sets``, default 24 = the presets' SSM layers: with fewer, the ring re-read every step stays L2-hot, which a
model's 24 rings are not), time per graph replay / (L R). Bytes are counted exactly (unique bytes a step must
move, averaged over the cycle: checkpoint reads, the flush's write, ring reads of i entries at cursor i, the ring
append, activations in and out). First checks replay vs eager at the real shapes over L+3 steps.
Prints a markdown table last and writes JSON.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys

import torch
from synodic.kernels.replay_common import LaunchPlan
from synodic.kernels.timing import COPY_GBPS_H200, graph_us

from benchmarks.ssm_decode import write_json
from synodic.results.env import git_commit

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 2 * L2_BYTES
SETS_STATE_BYTES = 32 * 2**30  # --sets cap (eager + replay cases are alive one at a time)
MAMBA = dict(H=128, P=64, N=128, G=8)
GDN = dict(HV=32, Hk=16, K=128, V=128)
L_DEFAULT = 16
ACT = torch.bfloat16
E = 2  # bytes per activation element
TARGETS = {("mamba2", "replay_fp32"): 1.75, ("mamba2", "replay_dual_bf16"): 2.5,
           ("mamba2", "replay_fp32_per_head"): 1.75, ("mamba2", "replay_dual_bf16_per_head"): 2.5,
           ("mamba2", "replay_dual_bf16_per_head_row"): 2.5,
           ("gdn", "replay_fp32_adjoint"): 1.6, ("gdn", "replay_fp32_state"): 1.6,
           ("gdn", "replay_fp32_adjoint_per_head"): 1.6}
# Launch configs swept for the engine's kernels (the per-head decode kernels; the head-group kernels' sweeps are
# in docs/tuning/replay.md).
# per-head (BLOCK_P, warps, flush fold)
PER_HEAD_SWEEP = [(32, 4, "serial"), (32, 2, "serial"), (64, 4, "serial"), (64, 2, "serial"), (16, 2, "serial"),
            (16, 4, "serial"), (64, 8, "serial"), (16, 1, "serial"), (8, 1, "serial"), (8, 2, "serial"),
            (64, 1, "serial")]
# GDN per-head (BLOCK_V, warps)
G_PER_HEAD_SWEEP = [(64, 2), (64, 1), (64, 4), (128, 2), (128, 4), (128, 1), (32, 1), (32, 2), (16, 1), (16, 2), (8, 1)]
# flush launch of a split (dual) step: (BLOCK, warps, fold, tiles per program); the launchers' defaults: 8 tiles
# per program (Mamba-2), 4 (GDN: 16 put the flush on a few long programs when cursors are staggered)
M_FLUSH_SWEEP = [(64, 4, "tf32x3", t) for t in (1, 2, 4, 8, 16)] + [(32, 2, "tf32x3", 1), (32, 4, "tf32x3", 2)]
G_FLUSH_SWEEP = [(32, 1, "bf16x3", t) for t in (1, 2, 4, 8, 16)] + [(32, 2, "bf16x3", 1), (16, 1, "bf16x3", 1)]
# GDN per-head at batch <= 8 (BLOCK_V, warps, flush fold): the flush's fold when latency, not registers, bounds the step
G_V2_SMALL_SWEEP = [(16, 2, "serial"), (16, 2, "dot"), (16, 2, "tf32x3"), (16, 1, "dot"), (16, 4, "dot"),
                    (32, 2, "dot"), (8, 2, "dot"), (8, 1, "dot")]


# ---------------------------------------------------------------------------------------------
class _Case:
    """What both layer kinds share: the state / cache set-up, the per-head shared-cursor model, the byte count."""

    def fns(self):
        """One step per slot set, the calls a timed graph cycles through."""
        return [lambda r=r: self.step(r) for r in range(self.rot)]

    def _setup(self, variant, batch, rot, L, config, S0, alloc):
        self.variant, self.batch, self.rot, self.L, self.config = variant, batch, rot, L, config
        self.ring = None  # per-head ring_by_cursor (None: the launcher's default)
        self.flush = None  # per-head flush_config of a split step (None: the launcher's default)
        self.dots = None  # per-head ring_dots (None: the launcher's default)
        self.split = None  # per-head split (None: the launcher's default)
        self.overlap = None  # per-head overlap of a split step's two launches (None: the launcher's default)
        if variant == "eager":
            self.state = S0
        else:
            self.c = alloc(lo_dtype=torch.bfloat16 if "dual_bf16" in variant else None)
            self.c["ckpt"].copy_(S0)
            if "ckpt_lo" in self.c:
                self.c["ckpt_lo"].copy_(S0.to(torch.bfloat16))
        # shared-cursor model: step i of every L-cycle reads cursor i (slot s: s + i if staggered)
        if "_per_head" in variant:
            phase = (torch.arange(S0.shape[0], device=S0.device) if "_stag" in variant
                     else torch.zeros(S0.shape[0], dtype=torch.long, device=S0.device))
            self.cursors = [((phase + i) % L).to(torch.int32) for i in range(L)]
            self.count = [0] * rot

    def _cursor_cache(self, r):
        """per-head: the cache with this step's cursor tensor (moved once per step outside the layer, as in the
        engine)."""
        i = self.count[r] % self.L
        self.count[r] += 1
        return dict(self.c, write_pos=self.cursors[i])

    def _bytes(self, io, st, entry):
        """Unique bytes of the average step over a full L-cycle (flush amortised)."""
        b, L = self.batch, self.L
        if self.variant == "eager":
            return io + 2 * b * st * 4
        lo = "dual_bf16" in self.variant
        tot = 0
        for i in range(L):
            tot += b * (i * entry + 8)                      # ring reads, write_pos ticket
            if i < L - 1:
                tot += b * (entry + st * (2 if lo else 4))  # append + checkpoint (or copy) read
            else:
                tot += b * st * (4 + 4 + (2 if lo else 0))  # flush: read + write (+ bf16 copy)
        return io + tot / L


class MambaCase(_Case):
    op = "mamba2"

    def __init__(self, variant, batch, rot, L, device, gen, config=None):
        from synodic.kernels.mamba2_replay import mamba2_replay_alloc
        H, P, N, G = (MAMBA[k] for k in "HPNG")
        slots = batch * rot
        S0 = torch.randn(slots, H, P, N, device=device, generator=gen) * 0.1
        self._setup(variant, batch, rot, L, config, S0,
                    lambda lo_dtype: mamba2_replay_alloc(slots, H, P, N, G, L, dtype=ACT, device=device,
                                                         lo_dtype=lo_dtype))
        self.A = -torch.rand(H, device=device, generator=gen) * 2 - 0.1
        self.D = torch.randn(H, device=device, generator=gen)
        self.bias = torch.randn(H, device=device, generator=gen) * 0.5
        perm = torch.randperm(slots, device=device, generator=gen).to(torch.int32)
        self.sets = [dict(x=torch.randn(batch, H, P, device=device, generator=gen).to(ACT),
                          dt=torch.randn(batch, H, device=device, generator=gen) * 0.7 - 1.0,
                          B=torch.randn(batch, G, N, device=device, generator=gen).to(ACT),
                          C=torch.randn(batch, G, N, device=device, generator=gen).to(ACT),
                          slot_ids=perm[r * batch:(r + 1) * batch].contiguous()) for r in range(rot)]

    def step(self, r):
        s = self.sets[r]
        if self.variant == "eager":
            from synodic.kernels.mamba2_decode import mamba2_decode
            return mamba2_decode(self.state, s["x"], s["dt"], self.A, s["B"], s["C"], self.D, self.bias,
                                 s["slot_ids"], backend="triton")
        from synodic.kernels.mamba2_replay import mamba2_replay_decode
        if "_per_head" in self.variant:
            c = self._cursor_cache(r)
            # "_row": the engine's per-step cursor gather (one for every layer) charged to this one layer
            row_wp = (c["write_pos"].index_select(0, s["slot_ids"].clamp(min=0)) if "_row" in self.variant
                      else None)
            return mamba2_replay_decode(**c, x=s["x"], dt=s["dt"], A=self.A, B=s["B"], C=s["C"], D=self.D,
                                        dt_bias=self.bias, slot_ids=s["slot_ids"], L=self.L, advance=False,
                                        backend="triton", row_wp=row_wp,
                                        plan=LaunchPlan(config=self.config, impl="per_head", ring_by_cursor=self.ring,
                                                        flush_config=self.flush, ring_dots=self.dots, split=self.split,
                                                        overlap=self.overlap))
        return mamba2_replay_decode(**self.c, x=s["x"], dt=s["dt"], A=self.A, B=s["B"], C=s["C"], D=self.D,
                                    dt_bias=self.bias, slot_ids=s["slot_ids"], L=self.L, backend="triton",
                                    plan=LaunchPlan(config=self.config))

    def bytes_per_step(self):
        b = self.batch
        H, P, N, G = (MAMBA[k] for k in "HPNG")
        io = b * (2 * H * P * E + H * 4 + 2 * G * N * E + 4) + 3 * H * 4
        return self._bytes(io, H * P * N, H * P * E + H * 4 + G * N * E)


class GDNCase(_Case):
    op = "gdn"

    def __init__(self, variant, batch, rot, L, device, gen, config=None):
        from synodic.kernels.gdn_replay import gdn_replay_alloc
        HV, Hk, K, V = (GDN[k] for k in ("HV", "Hk", "K", "V"))
        slots = batch * rot
        S0 = torch.randn(slots, HV, V, K, device=device, generator=gen) * 0.1
        self._setup(variant, batch, rot, L, config, S0,
                    lambda lo_dtype: gdn_replay_alloc(slots, HV, V, K, Hk, L, dtype=ACT, device=device,
                                                      lo_dtype=lo_dtype))
        self.route = "state" if variant.endswith("_state") else "adjoint"
        perm = torch.randperm(slots, device=device, generator=gen).to(torch.int32)
        self.sets = [dict(q=torch.randn(batch, Hk, K, device=device, generator=gen).to(ACT),
                          k=torch.randn(batch, Hk, K, device=device, generator=gen).to(ACT),
                          v=torch.randn(batch, HV, V, device=device, generator=gen).to(ACT),
                          g=torch.nn.functional.logsigmoid(torch.randn(batch, HV, device=device, generator=gen) + 2),
                          beta=torch.sigmoid(torch.randn(batch, HV, device=device, generator=gen)),
                          slot_ids=perm[r * batch:(r + 1) * batch].contiguous()) for r in range(rot)]

    def step(self, r):
        s = self.sets[r]
        if self.variant == "eager":
            from synodic.kernels.gdn_decode import gdn_decode
            return gdn_decode(self.state, s["q"], s["k"], s["v"], s["g"], s["beta"], s["slot_ids"],
                              backend="triton")
        from synodic.kernels.gdn_replay import gdn_replay_decode
        if "_per_head" in self.variant:
            return gdn_replay_decode(**self._cursor_cache(r), q=s["q"], k=s["k"], v=s["v"],
                                     g=s["g"], beta=s["beta"], slot_ids=s["slot_ids"], L=self.L, advance=False,
                                     backend="triton",
                                     plan=LaunchPlan(config=self.config, impl="per_head", ring_by_cursor=self.ring,
                                                     flush_config=self.flush, ring_dots=self.dots, split=self.split,
                                                     overlap=self.overlap))
        return gdn_replay_decode(**self.c, q=s["q"], k=s["k"], v=s["v"], g=s["g"], beta=s["beta"],
                                 slot_ids=s["slot_ids"], L=self.L, route=self.route, backend="triton",
                                 plan=LaunchPlan(config=self.config))

    def bytes_per_step(self):
        b = self.batch
        HV, Hk, K, V = (GDN[k] for k in ("HV", "Hk", "K", "V"))
        io = b * (2 * Hk * K * E + 2 * HV * V * E + 2 * HV * 4 + 4)
        return self._bytes(io, HV * V * K, HV * V * E + Hk * K * E + HV * 4)


# ---------------------------------------------------------------------------------------------
def rel_rmse(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def check(cls, variant, L, device):
    """Replay vs eager (both Triton) at the real shapes: batch 6 with a padding row, L+3 steps
    (crossing a flush), fresh inputs every step."""
    gen = torch.Generator(device=device).manual_seed(0)
    ref = cls("eager", 6, 1, L, device, gen)
    gen = torch.Generator(device=device).manual_seed(0)
    rep = cls(variant, 6, 1, L, device, gen)  # same draws: same S0, parameters and inputs
    rep.sets = ref.sets
    ref.sets[0]["slot_ids"] = torch.tensor([3, 0, -1, 5, 1, 2], dtype=torch.int32, device=device)
    worst = 0.0
    for _ in range(L + 3):
        for key, t in ref.sets[0].items():
            if key in ("g", "beta"):
                t.copy_(torch.rand(t.shape, device=device, generator=gen) * 0.9 + 0.05)
                if key == "g":
                    t.log_()
            elif key == "dt":
                t.copy_(torch.randn(t.shape, device=device, generator=gen) * 0.7 - 1.0)
            elif key != "slot_ids":
                t.copy_(torch.randn(t.shape, device=device, generator=gen).to(t.dtype))
        yr = ref.step(0)
        yp = rep.step(0)
        worst = max(worst, rel_rmse(yp, yr))
        assert (yp[2] == 0).all()
    tol = 5e-3 if "bf16" not in variant else 2e-2  # bf16 outputs (~1 ulp), + bf16 copy in dual
    return dict(op=cls.op, variant=variant, rel_rmse=worst, ok=worst < tol)


def check_verify(cls, L, device, T=4, rounds=3):
    """Speculative path at the real shapes: flush(min_room=T) -> verify (T outputs vs sequential
    eager Triton steps) -> commit with per-row acceptance; 3 rounds (crosses an early flush)."""
    from synodic.kernels.gdn_replay import gdn_replay_flush, gdn_replay_verify
    from synodic.kernels.mamba2_replay import mamba2_replay_flush, mamba2_replay_verify, replay_commit
    variant = "replay_fp32" if cls is MambaCase else "replay_fp32_adjoint"
    gen = torch.Generator(device=device).manual_seed(0)
    ref = cls("eager", 6, 1, L, device, gen)
    gen = torch.Generator(device=device).manual_seed(0)
    rep = cls(variant, 6, 1, L, device, gen)
    sid = torch.tensor([3, 0, -1, 5, 1, 2], dtype=torch.int32, device=device)
    acc = torch.tensor([2, 4, 1, 3, 4, 1], dtype=torch.int32, device=device)
    worst = 0.0
    for _ in range(rounds):
        win = {}
        for key, t in ref.sets[0].items():
            if key == "slot_ids":
                continue
            shape = (t.shape[0], T) + tuple(t.shape[1:])
            w = torch.randn(shape, device=device, generator=gen)
            if key == "g":
                w = torch.nn.functional.logsigmoid(w + 2)
            elif key == "beta":
                w = torch.sigmoid(w)
            elif key == "dt":
                w = w * 0.7 - 1.0
            win[key] = w.to(t.dtype)
        if cls is MambaCase:
            mamba2_replay_flush(**rep.c, A=rep.A, slot_ids=sid, L=L, min_room=T)
            y = mamba2_replay_verify(**rep.c, x=win["x"], dt=win["dt"], A=rep.A, B=win["B"], C=win["C"], D=rep.D,
                                     dt_bias=rep.bias, slot_ids=sid, L=L)
        else:
            gdn_replay_flush(**rep.c, slot_ids=sid, L=L, min_room=T)
            y = gdn_replay_verify(**rep.c, q=win["q"], k=win["k"], v=win["v"], g=win["g"], beta=win["beta"],
                                  slot_ids=sid, L=L)
        states = []
        for r in range(T):
            for key, w in win.items():
                ref.sets[0][key] = w[:, r].contiguous()
            ref.sets[0]["slot_ids"] = sid
            y_r = ref.step(0)
            worst = max(worst, rel_rmse(y[:, r], y_r))
            states.append(ref.state.clone())
        for i, s_ in enumerate(sid.tolist()):
            if s_ >= 0:
                ref.state[s_] = states[int(acc[i]) - 1][s_]
        replay_commit(rep.c["write_pos"], acc, sid)
    return dict(op=cls.op, variant=variant + "_verify_T4", rel_rmse=worst, ok=worst < 5e-3)






def _rot(cls, batch, sets=0):
    """Slot sets one graph cycles through: enough that the fp32 states touched exceed 2x L2, or `sets` (a model
    with that many SSM layers: each layer's ring is then cold in L2 when its next step comes, as in the engine),
    capped so the sets' fp32 states stay within SETS_STATE_BYTES."""
    per = batch * (MAMBA["H"] * MAMBA["P"] * MAMBA["N"] if cls is MambaCase
                   else GDN["HV"] * GDN["V"] * GDN["K"]) * 4
    return max(1, math.ceil(ROTATE_BYTES / per), min(sets, SETS_STATE_BYTES // per))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_replay.json")
    ap.add_argument("--batches", default="1,8,32,128,256,512")
    ap.add_argument("--L", type=int, default=L_DEFAULT)
    ap.add_argument("--ops", default="mamba2,gdn")
    ap.add_argument("--sweep", default="", help="batches at which to time a few replay configs")
    ap.add_argument("--ring-sweep", default="", help="batches at which to time the per-head kernels' default configs "
                    "reading the whole ring vs only the entries below the cursor (ring_by_cursor False / True)")
    ap.add_argument("--dots-sweep", default="", help="batches at which to time the per-head kernels' default configs "
                    "without and with the key-head / group prologue (ring_dots False / True; Mamba-2: split steps)")
    ap.add_argument("--stagger", action="store_true", help="add the per-head rows with staggered cursors (*_stag)")
    ap.add_argument("--flush-sweep", default="", help="batches at which to time the split (dual) per-head rows over "
                    "flush launch configs (tiles per program)")
    ap.add_argument("--overlap-sweep", default="",
                    help="batches at which to time the split (dual) per-head rows with the "
                    "flush launch in order / beside the output-only launch (overlap False / True)")
    ap.add_argument("--split-sweep", default="", help="batches at which to time the dual per-head rows as one fused "
                    "launch / a split step (split False / True)")
    ap.add_argument("--sets", type=int, default=24, help="cycle through at least this many slot sets (default 24: "
                    "both presets' SSM layer count, so each ring is cold in L2 as in the engine; 0: only the 2x-L2 "
                    "rule, which keeps a batch-256 ring L2-hot and flatters Mamba-2 replay by 5-6 %%)")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_replay: needs a CUDA GPU")
    import triton
    device = "cuda"
    L = args.L
    batches = [int(b) for b in args.batches.split(",") if b]
    sweep_batches = [int(b) for b in args.sweep.split(",") if b]
    ring_batches = [int(b) for b in args.ring_sweep.split(",") if b]
    flush_batches = [int(b) for b in args.flush_sweep.split(",") if b]
    dots_batches = [int(b) for b in args.dots_sweep.split(",") if b]
    overlap_batches = [int(b) for b in args.overlap_sweep.split(",") if b]
    split_batches = [int(b) for b in args.split_sweep.split(",") if b]
    stag = ((lambda vs: vs + [v + "_stag" for v in vs if v.endswith(("_per_head", "_per_head_row"))]) if args.stagger
            else (lambda vs: vs))
    ops = []
    if "mamba2" in args.ops:
        ops.append((MambaCase, stag(["eager", "replay_fp32", "replay_dual_bf16", "replay_fp32_per_head",
                                     "replay_dual_bf16_per_head", "replay_dual_bf16_per_head_row"]), PER_HEAD_SWEEP))
    if "gdn" in args.ops:
        ops.append((GDNCase, stag(["eager", "replay_fp32_adjoint", "replay_fp32_state", "replay_dual_bf16_adjoint",
                                   "replay_fp32_adjoint_per_head", "replay_dual_bf16_adjoint_per_head"]),
                                   G_PER_HEAD_SWEEP))
    res = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               command="python -m benchmarks.replay " + " ".join(argv if argv is not None
                                                                          else sys.argv[1:]),
               device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), git_commit=git_commit(), L=L, hbm_gbps_reference=COPY_GBPS_H200,
               shapes=dict(mamba2=MAMBA, gdn=GDN), activations=str(ACT), checks=[], rows=[], sweep=[])
    if not args.no_check:
        for cls, variants, _ in ops:
            for v in variants[1:]:
                if v.endswith("_stag"):  # the same kernels; their rings start empty at every phase: timing only
                    continue
                c = check(cls, v, L, device)
                res["checks"].append(c)
                print(f"check {c['op']} {v}: rel_rmse vs eager {c['rel_rmse']:.2e} -> {'OK' if c['ok'] else 'FAIL'}",
                      flush=True)
            c = check_verify(cls, L, device)
            res["checks"].append(c)
            print(f"check {c['op']} {c['variant']}: rel_rmse vs eager {c['rel_rmse']:.2e} -> "
                  f"{'OK' if c['ok'] else 'FAIL'}", flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    for cls, variants, grid in ops:
        for batch in batches:
            rot = _rot(cls, batch, args.sets)
            eager_us = None
            for v in variants:
                case = cls(v, batch, rot, L, device, gen)
                us = graph_us(case.fns(), calls=case.L * case.rot, warmup_ms=5, rep_ms=100)
                nbytes = case.bytes_per_step()
                if v == "eager":
                    eager_us = us
                row = dict(op=cls.op, variant=v, batch=batch, rotate=rot, us=us, bytes=nbytes,
                           gbps=nbytes / (us * 1e3), pct_hbm=100 * nbytes / (us * 1e3) / COPY_GBPS_H200,
                           speedup=(eager_us / us) if eager_us else None)
                res["rows"].append(row)
                print(f"{cls.op} {v:26s} b={batch:4d}: {us:8.1f} µs  {row['gbps']:6.0f} GB/s "
                      f"({row['pct_hbm']:5.1f} %)  x{row['speedup'] or 0:.2f}", flush=True)
                if batch in sweep_batches and v.endswith(("_per_head", "_per_head_stag")):
                    _sweep(res, case, eager_us, "config", G_V2_SMALL_SWEEP if cls is GDNCase and batch <= 8 else grid)
                if batch in ring_batches and "_per_head" in v:
                    _sweep(res, case, eager_us, "ring", (False, True))
                if batch in dots_batches and "_per_head" in v and (cls is GDNCase or "dual" in v):
                    _sweep(res, case, eager_us, "dots", (False, True, False, True))
                if batch in flush_batches and "dual" in v and "_per_head" in v and "_row" not in v:
                    _sweep(res, case, eager_us, "flush", G_FLUSH_SWEEP if cls is GDNCase else M_FLUSH_SWEEP)
                if batch in overlap_batches and "dual" in v and "_per_head" in v:
                    case.split = True
                    _sweep(res, case, eager_us, "overlap", (False, True, False, True))
                    case.split = None
                if batch in split_batches and "dual" in v and "_per_head" in v:
                    _sweep(res, case, eager_us, "split", (False, True, False, True))
                del case
                torch.cuda.empty_cache()
            with open(args.out + ".partial", "w") as f:  # survives a timeout
                json.dump(res, f, indent=1)
    _write(res, args.out)
    return 0 if all(c["ok"] for c in res["checks"]) else 1


def _sweep(res, case, eager_us, attr, values):
    """Time the case with case.<attr> ("config", "ring", "flush", "dots", "overlap" or "split") set to each value,
    then back to None (the launcher's default); rows go to res["sweep"] under the key "config" / "ring_by_cursor" /
    "flush_config" / "ring_dots" / "overlap" / "split"."""
    key = {"config": "config", "ring": "ring_by_cursor", "flush": "flush_config", "dots": "ring_dots",
           "overlap": "overlap", "split": "split"}[attr]
    for val in values:
        setattr(case, attr, val)
        t = graph_us(case.fns(), calls=case.L * case.rot, warmup_ms=5, rep_ms=100)
        res["sweep"].append({"op": case.op, "variant": case.variant, "batch": case.batch, key: val, "us": t,
                             "speedup": eager_us / t})
        print(f"   {key}={val}: {t:8.1f} µs  x{eager_us / t:.2f}", flush=True)
    setattr(case, attr, None)


def _write(res, path):
    lines = [f"ReplaySSM decode, L={res['L']}, {res['device']}, {res['date']}, avg step over full cycles, "
             "CUDA graphs", "",
             "| op | variant | batch | µs / step | GB/s | % of copy rate | speedup vs eager fp32 | target |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        tgt = TARGETS.get((r["op"], r["variant"].removesuffix("_stag")))  # staggered: the same kernel and bar
        tmark = ""
        if r["variant"] != "eager":
            if r["batch"] == 256 and tgt:
                tmark = f"≥{tgt}: {'met' if r['speedup'] >= tgt else 'MISSED'}"
            elif r["batch"] <= 8:
                tmark = f"≥0.97: {'met' if r['speedup'] >= 0.97 else 'MISSED'}"
        lines.append(f"| {r['op']} | {r['variant']} | {r['batch']} | {r['us']:.1f} | {r['gbps']:.0f} | "
                     f"{r['pct_hbm']:.1f} | {r['speedup']:.2f} | {tmark} |" if r["speedup"] else
                     f"| {r['op']} | {r['variant']} | {r['batch']} | {r['us']:.1f} | {r['gbps']:.0f} | "
                     f"{r['pct_hbm']:.1f} | 1.00 | |")
    res["table_md"] = "\n".join(lines)
    if res["sweep"]:
        print("\n| op | variant | batch | (block, heads/prog, warps, maxnreg) | µs | speedup |")
        print("|---|---|---|---|---|---|")
        for s in res["sweep"]:
            key = next(k for k in ("config", "flush_config", "ring_dots", "ring_by_cursor", "overlap", "split")
                       if k in s)
            what = tuple(s[key]) if key == "config" else f"{key}={tuple(s[key]) if key == 'flush_config' else s[key]}"
            print(f"| {s['op']} | {s['variant']} | {s['batch']} | {what} | {s['us']:.1f} | {s['speedup']:.2f} |")
    print()
    write_json(res, path)


if __name__ == "__main__":
    sys.exit(main())
