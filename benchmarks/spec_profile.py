"""Where a speculative step's time goes: torch.profiler over one measured round of benchmarks.spec_decode's
setup (one model, batch and spec), printing the top ops by device and by host time, and kernels per step.
--census instead lists every op of one speculative step (CPU-capable, no profiler): each GEMM with the module
that ran it (target, drafter or engine), its dtype, shapes and flops, and the op count per owner, per scheme.

    python -m benchmarks.spec_profile --model tiny_mamba2 --spec dflash2 --batch 1 --out prof.txt
    python -m benchmarks.spec_profile --census --specs dflash2 dspark dflash --device cpu --out census.txt"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from benchmarks._cli import compose_or_exit, out_file, positive_int
from benchmarks.spec_decode import GPU, SMOKE, heldout_prompts

# the argument that sets each config key, named in a composition error
FLAGS = {"model": "--model", "spec": "--spec", "ssm": "--ssm", "runtime.cuda_graphs": "--graphs",
         "runtime.max_slots": "--batch"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny_mamba2")
    ap.add_argument("--spec", default="dflash2")
    ap.add_argument("--batch", type=positive_int, default=1)
    ap.add_argument("--ssm", default="replay")
    ap.add_argument("--graphs", default="true")
    ap.add_argument("--out", type=out_file, default=Path("spec_profile.txt"))
    ap.add_argument("--census", action="store_true", help="the ops of one speculative step per --specs scheme")
    ap.add_argument("--specs", nargs="+", default=["dflash2", "dspark", "dflash"], help="--census: the schemes")
    ap.add_argument("--device", default=None, help="--census: runtime.device (default: cuda if present, else cpu)")
    ap.add_argument("--step", type=positive_int, default=3,
                    help="--census: which speculative step of the round (1-based)")
    ap.add_argument("--over", nargs="*", default=[], help="more config overrides (e.g. "
                    "spec.num_speculative_tokens=3 spec.drafter=random model.overrides.hidden_size=256)")
    a = ap.parse_args(argv)
    if a.census:
        for spec in a.specs:  # every scheme's config before the first one runs
            compose_or_exit(ap, census_overrides(a, spec, census_device(a)),
                            {**FLAGS, "spec": "--specs", "runtime.device": "--device"})
        return census_main(a)
    from torch.profiler import ProfilerActivity, profile

    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.engine.text import load_codec
    from synodic.graph import build_graph, checkpoint_dir
    p = dict(GPU if torch.cuda.is_available() else SMOKE)
    over = [f"model={a.model}", f"ssm={a.ssm}", f"spec={a.spec}", *_every_step(a.spec), f"runtime.device={p['device']}",
            f"runtime.max_slots={a.batch}", f"runtime.cuda_graphs={a.graphs}", *a.over]
    compose_or_exit(ap, over, FLAGS)
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


def census_main(a) -> None:
    from synodic.config.compose import compose
    from synodic.engine.engine import Engine
    from synodic.engine.request import Request, SamplingParams
    from synodic.engine.text import load_codec
    from synodic.graph import build_graph, checkpoint_dir
    device = census_device(a)
    p = dict(GPU if device == "cuda" else SMOKE)
    out_tokens = max(p["output_tokens"], 8 * (a.step + 1))  # the round must reach that step
    text, rows = [], {}
    for spec in a.specs:
        over = census_overrides(a, spec, device)
        cfg = compose(over)
        prompts = heldout_prompts(load_codec(checkpoint_dir(cfg.model)), a.batch, p["prompt_tokens"])
        eng = Engine(build_graph(cfg, max_seq_len=p["prompt_tokens"] + out_tokens + 16))
        inner, seen, got = eng._spec_step, [0], {}

        def spec_step(batch, on_token, progress, inner=inner, seen=seen, got=got, eng=eng):
            seen[0] += 1
            if seen[0] != a.step:
                return inner(batch, on_token, progress)
            got["census"] = census_step(eng, lambda: inner(batch, on_token, progress))
        eng._spec_step = spec_step
        eng.generate([Request(i, list(pr), SamplingParams(max_tokens=out_tokens)) for i, pr in enumerate(prompts)])
        if "census" not in got:
            raise SystemExit(f"error: --step={a.step}: the round ran {seen[0]} speculative steps; expected --step <= "
                             f"{seen[0]}")
        rows[spec] = got["census"]
        text.append(census_table(got["census"], f"{' '.join(over)}: speculative step {a.step}, batch {a.batch}"))
    a.out.write_text("\n\n".join(text) + "\n")
    a.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n\n".join(text))


def census_device(a) -> str:
    return a.device or ("cuda" if torch.cuda.is_available() else "cpu")


def census_overrides(a, spec: str, device: str) -> list[str]:
    return [f"model={a.model}", f"ssm={a.ssm}", f"spec={spec}", *_every_step(spec), f"runtime.device={device}",
            f"runtime.max_slots={a.batch}", "runtime.cuda_graphs=false", *a.over,
            "runtime.overlap=false"]  # one _spec_step call a step (overlapped, one call serves a chain of them)


# -- census: every op of one speculative step, attributed to its owner (target / drafter / engine) ----------------
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "dot", "mv", "_scaled_mm", "_int_mm",
         "_weight_int4pack_mm", "_weight_int8pack_mm"}
DRAFTER_CALLS = ("propose", "draft_device", "commit_device", "on_commit", "on_prefill")


class _Scopes:
    """Module paths of the running code: forward hooks on the target's and the drafter's modules, and the
    drafter runtime's entry points wrapped (its head runs the target's lm_head outside any drafter module)."""

    def __init__(self, eng):
        self.stack: list[str] = []
        self.handles = []
        for prefix, root in (("target", eng.graph.model), ("drafter", getattr(eng.drafter, "model", None))):
            if root is None:
                continue
            for name, m in root.named_modules():
                path = f"{prefix}.{name}" if name else prefix
                self.handles.append(m.register_forward_pre_hook(lambda _m, _a, p=path: self.stack.append(p)))
                self.handles.append(m.register_forward_hook(self._leave))
        self.restore = []
        import synodic.engine.runner as runner_mod
        runner = eng.runner
        calls = [(eng.drafter, name, f"drafter:{name}") for name in DRAFTER_CALLS]
        # the engine's parts of the step: acceptance (verify, the drafter's decide) and the backends' commits
        calls += [(runner_mod, "verify", "engine:verify"), (eng.drafter, "decide", "engine:decide"),
                  (runner.ssm, "begin_window", "engine:ssm.begin_window"), (runner.ssm, "commit", "engine:ssm.commit"),
                  (runner.kv, "commit", "engine:kv.commit")]
        for obj, name, label in calls:
            fn = getattr(obj, name, None) if obj is not None else None
            if fn is not None:
                own = name in vars(obj)  # an instance's (or module's) own attribute, else the class's
                self.restore.append((obj, name, fn if own else None))
                setattr(obj, name, self._scoped(label, fn))

    def _leave(self, _m, _a, _o) -> None:  # (a forward hook's return value would replace the output)
        self.stack.pop()

    def _scoped(self, path, fn):
        def run(*a, **k):
            self.stack.append(path)
            try:
                return fn(*a, **k)
            finally:
                self.stack.pop()
        return run

    def owner(self) -> tuple[str, str]:
        """(owner, innermost module path, layer indices as *): the outermost scope owns, so the drafter's
        call into the target's lm_head is the drafter's."""
        if not self.stack:
            return "engine", "-"
        outer, path = self.stack[0], re.sub(r"\.\d+(?=\.|$)", ".*", self.stack[-1])
        owner = outer.split(".")[0].split(":")[0]
        return owner, (f"{outer} > {path}" if outer.startswith("drafter:") and path.startswith("target") else path)

    def scope(self) -> str:
        """Where a non-GEMM kernel ran: the outermost scope and the innermost module (layers as *)."""
        if not self.stack:
            return "engine"
        inner = re.sub(r"\.\d+(?=\.|$)", ".*", self.stack[-1])
        return self.stack[0] if inner == self.stack[0] else f"{self.stack[0]} > {inner}"

    def close(self, eng):
        for h in self.handles:
            h.remove()
        for obj, name, fn in reversed(self.restore):
            if fn is None:  # it was the class's: drop the instance attribute
                delattr(obj, name)
            else:
                setattr(obj, name, fn)


def census_step(eng, step, device_kernels: bool = True) -> dict:
    """Ops of one engine step (`step()`: Engine._spec_step on its batch, eager): each GEMM with its module
    path, dtypes, shapes and flops; op counts by owner; each op's kind (op_kind) by owner, and the non-GEMM
    kernels by scope (what a device step launches besides its GEMMs). device_kernels: a kernel package's torch
    reference counts as the one launch it is on CUDA (see _opaque_refs)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    scopes = _Scopes(eng)
    gemms, counts, kinds, where = [], {}, {}, {}

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            owner, path = scopes.owner()
            name = func.__name__.split(".")[0]
            counts.setdefault(owner, {}).setdefault(name, 0)
            counts[owner][name] += 1
            if name in GEMMS:
                ts = [a for a in args if isinstance(a, torch.Tensor)]
                shapes = [list(t.shape) for t in ts]
                flops = _flops(name, args)
                gemms.append({"owner": owner, "module": path, "op": name,
                              "dtype": "/".join(dict.fromkeys(str(t.dtype).replace("torch.", "") for t in ts)),
                              "shapes": shapes, "flops": flops})
            out = func(*args, **(kwargs or {}))
            kind = op_kind(func, name, args, kwargs or {}, out)
            kinds.setdefault(owner, {}).setdefault(kind, 0)
            kinds[owner][kind] += 1
            if kind == "kernel":
                key = f"{owner} | {scopes.scope()} | {name}"
                where[key] = where.get(key, 0) + 1
            return out

    def launch(name):  # a kernel package's torch reference stands in for one device launch (Triton on CUDA)
        owner, _ = scopes.owner()
        for d, k in ((counts, name), (kinds, "kernel")):
            d.setdefault(owner, {}).setdefault(k, 0)
            d[owner][k] += 1
        key = f"{owner} | {scopes.scope()} | {name}"
        where[key] = where.get(key, 0) + 1

    undo = _opaque_refs(launch, Census) if device_kernels else []
    try:
        with Census():
            step()
    finally:
        scopes.close(eng)
        for mod, name, fn in undo:
            setattr(mod, name, fn)
    return {"gemms": gemms, "ops": counts, "kinds": kinds, "kernels": where}


def _opaque_refs(launch, mode) -> list:
    """Wrap every kernel package's torch references (kernels.<op>.<name>_ref, as the package calls them) and
    Triton launchers (kernels.<op>.triton_impl.<name>_triton, imported when called; the replay kernels launch
    otherwise and go uncounted on CUDA: use the profiler mode there) so one call counts as one
    launch ('triton:<name>') and its own torch ops are not counted: on the CPU the census runs the references,
    on CUDA the launchers (one fused kernel each, or a few). Returns what to put back."""
    import sys

    from torch.utils._python_dispatch import _pop_mode_temporarily
    undo = []
    for mname, mod in list(sys.modules.items()):
        if not (mname.startswith(("kernels.", "synodic.kernels.")) and mname.count(".") == mname.startswith(
                "synodic.") + 1) or mod is None:
            continue
        impl = sys.modules.get(f"{mname}.triton_impl")  # the launchers, imported by the package at call time
        found = [(mod, n, f, n[:-4]) for n, f in vars(mod).items()
                 if n.endswith("_ref") and callable(f) and getattr(f, "__module__", "").endswith(".ref")]
        found += [(impl, n, f, n[:-7]) for n, f in (vars(impl).items() if impl is not None else ())
                  if n.endswith("_triton") and callable(f) and getattr(f, "__module__", "") == impl.__name__]
        for owner_mod, name, fn, label in found:
            def wrapped(*a, _fn=fn, _label=label, **k):
                launch(f"triton:{_label}")
                with _pop_mode_temporarily():  # the reference's own ops are that one launch
                    return _fn(*a, **k)
            undo.append((owner_mod, name, fn))
            setattr(owner_mod, name, wrapped)
    return undo


NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
             "alias", "_unsafe_view"}
SYNCS = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal"}


def op_kind(func, name: str, args, kwargs, out) -> str:
    """'gemm' | 'view' (metadata only: a view, or an op that returned one of its inputs) | 'alloc' (uninitialised
    memory) | 'sync' (reads a value back to the host) | 'kernel' (launches device work: every other op, in-place
    ones included)."""
    if name in GEMMS:
        return "gemm"
    if name in SYNCS:
        return "sync"
    if name in NO_KERNEL:
        return "alloc" if name.startswith(("empty", "new_empty")) else "view"
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "kernel"  # in place / out=
    if func.is_view:
        return "view"
    outs = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    ins = {t.untyped_storage().data_ptr() for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)}
    if outs and all(t.untyped_storage().data_ptr() in ins or t.numel() == 0 for t in outs):
        return "view"  # e.g. .to() / .contiguous() that had nothing to do, or an empty result
    return "kernel"


def _flops(name: str, args) -> int:
    """2 * M * N * K of one GEMM call (linear: x, weight [N, K]; addmm / baddbmm: bias, a, b; else a, b)."""
    if name == "linear":
        return 2 * args[0].numel() * args[1].shape[0]
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm") else (args[0], args[1])
    return 2 * a.numel() * (b.shape[-1] if b.dim() > 1 else 1)


def census_table(c: dict, title: str) -> str:
    """GEMMs grouped by (owner, module, op, dtype, shapes) with their count and flops; op totals by owner."""
    rows: dict[tuple, list] = {}
    for g in c["gemms"]:
        k = (g["owner"], g["module"], g["op"], g["dtype"], " x ".join(map(str, g["shapes"])))
        rows.setdefault(k, [0, 0])
        rows[k][0] += 1
        rows[k][1] += g["flops"]
    total = sum(f for _, f in rows.values()) or 1
    lines = [title, f"{'owner':8s} {'n':>3s} {'MFLOP':>8s} {'share':>6s}  {'op':6s} {'dtype':8s} module / shapes"]
    for (owner, mod, op, dt, shp), (n, f) in sorted(rows.items(), key=lambda kv: (kv[0][0], -kv[1][1])):
        lines.append(f"{owner:8s} {n:3d} {f / 1e6:8.2f} {100 * f / total:5.1f}%  {op:6s} {dt:8s} {mod}  {shp}")
    mine = {o: [g for g in c["gemms"] if g["owner"] == o] for o in sorted(c["ops"])}
    lines.append("GEMMs by owner: " + ", ".join(
        f"{o} {len(gs)} ({sum(g['flops'] for g in gs) / 1e6:.2f} MFLOP)" for o, gs in mine.items()))
    lines.append("all ops by owner: " + ", ".join(f"{o} {sum(v.values())}" for o, v in sorted(c["ops"].items())))
    if "kinds" in c:
        k = c["kinds"]
        total = sum(v.get("kernel", 0) for v in k.values())
        lines.append(f"non-GEMM kernels per step: {total} (" + ", ".join(
            f"{o} {v.get('kernel', 0)}" for o, v in sorted(k.items())) + "); by kind: " + "; ".join(
            f"{o} " + " ".join(f"{n}={m}" for n, m in sorted(v.items())) for o, v in sorted(k.items())))
        lines.append("non-GEMM kernels by scope (owner | scope | op: count), top 40:")
        for key, n in sorted(c["kernels"].items(), key=lambda kv: -kv[1])[:40]:
            lines.append(f"  {n:4d}  {key}")
    for o, v in sorted(c["ops"].items()):
        top = sorted(v.items(), key=lambda kv: -kv[1])[:12]
        lines.append(f"  {o}: " + " ".join(f"{k}={n}" for k, n in top))
    return "\n".join(lines)


def _every_step(spec: str) -> list[str]:
    """spec.gate=off for a speculative scheme: the profile is of drafting steps, which the gate may skip."""
    return [] if spec.split()[0] == "none" else ["spec.gate=off"]


if __name__ == "__main__":
    main()
