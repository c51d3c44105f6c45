"""pipeline=quantize: solve the model's linears once and store a quantized checkpoint that
`quant=<format>` runs load (artifact=auto).

    python run.py pipeline=quantize quant=mxfp4 [quant.method=rtn] [pipeline.executor=inline]

One task per layer group (a block), as Ray tasks (a local instance, or pipeline.ray_address) or in
this process (executor=inline: tests, tiny models). Each finished group is written atomically under
<store>/<hash>/parts/, the hash covering (model weights identity, quant config), so a killed job,
run again, skips the finished groups and resumes at the next unfinished one. When every group is
there the parts merge into quantized.safetensors and manifest.json (format, method, per-layer
reconstruction error) is written last. An artifact that is already complete is reported, not redone.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from synodic.config.netcheck import RayAddress
from synodic.config.registry import Component, register

log = logging.getLogger(__name__)


@register("pipeline")
class QuantizePipeline(Component):
    kind: Literal["quantize"] = "quantize"
    executor: Literal["ray", "inline"] = Field("ray", description="ray: one Ray task per layer group; inline: "
                                               "groups solved one after another in this process")
    workers: int = Field(2, ge=1, description="layer groups solved at once (Ray tasks; CPUs of a local Ray instance)")
    ray_address: RayAddress = Field(None, description="Ray cluster to join ('auto', 'host:port', 'ray://...'), "
                                    "checked and joined as runtime.address is (synodic/distributed/cluster.py); "
                                    "null: start a local instance")
    store: str | None = Field(None, description="store root; null: outputs/quant_store, or $SYNODIC_QUANT_STORE")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where layers are solved; auto: cuda if "
                                                   "present, else cpu")
    threads: int = Field(1, ge=1, le=1024, description="torch threads per Ray task (inline: this process's, if "
                         "above 1)")
    overwrite: bool = Field(False, description="discard what the store holds for this hash and start over")
    export_hf: str | None = Field(None, description="also write the quantized model as a Hugging Face folder in "
                                  "the compressed-tensors layout here (vLLM / llm-compressor read it): quant=nvfp4 "
                                  "or mxfp4, quant.method=rtn, weight-only, model.weights=<HF folder>; "
                                  "docs/checkpoints.md")

    @field_validator("store", "export_hf")
    @classmethod
    def _writable(cls, v: str | None) -> str | None:  # checked before the layers are solved, not after
        from synodic.config.files import writable_dir_or_none
        return writable_dir_or_none(v)


def quantize_to_store(model, qcfg, store_root: Path | str | None = None, *, executor: str = "inline",
                      workers: int = 2, ray_address: str | None = None, device: str = "cpu", threads: int = 1,
                      overwrite: bool = False, progress: bool = True, on_group_done=None,
                      model_info: dict | None = None) -> dict:
    """Quantize `model`'s selected linears into the store; returns the manifest plus run counters
    (`computed_groups`, `resumed_groups`, `quantize_s`, `artifact`). `on_group_done(group, stats)` is
    called after each group's part is on disk (tests raise from it to simulate a kill)."""
    import shutil

    from synodic.quant import apply, store
    from synodic.results.locks import exclusive

    t0 = time.perf_counter()
    names, skipped = apply.checked_linears(model, qcfg)
    identity = apply.model_identity(model)
    key = apply.artifact_hash(identity, qcfg)
    adir = Path(store_root or store.default_store()) / key
    _check_store_paths(store_root, adir, adir.with_name(f".{key}.lock"))
    # one process per store entry: a second quantize of the same weights + config fails in one line
    with exclusive(adir.with_name(f'.{key}.lock'), 'quant.artifact', adir):
        if overwrite and adir.exists():
            shutil.rmtree(adir)
        if store.is_complete(adir):
            man = store.verify_artifact(adir)  # "complete" only when its bytes check out
            return {**man, "artifact": str(adir), "computed_groups": 0, "resumed_groups": len(man["groups"]),
                    "quantize_s": time.perf_counter() - t0, "already_complete": True}
        (adir / store.PARTS).mkdir(parents=True, exist_ok=True)
        store.clean_tmp(adir)
        todo_all = apply.groups(names)
        done = store.done_groups(adir) & set(todo_all)
        for g in done:  # a damaged part is found before any solving, not after the merge
            store.verify_part(store.part_path(adir, g))
        todo = {g: ns for g, ns in todo_all.items() if g not in done}
        mods = dict(model.named_modules())
        absmax = None
        if qcfg.method == "smoothquant" and todo:
            ids = apply.calibration_ids(model.config.vocab_size, qcfg.calib_samples, qcfg.calib_len)
            absmax = apply.calibrate(model, [n for ns in todo.values() for n in ns], ids)

        def task_args(g):
            ws = {n: mods[n].weight.detach() for n in todo[g]}
            am = None if absmax is None else {n: absmax[n] for n in todo[g]}
            return g, ws, am

        from synodic.results.progress import progress as show_progress
        with show_progress(f"quantize {qcfg.kind} {qcfg.method}", len(todo_all), "groups", done=len(done),
                           enabled=progress) as advance:

            def finished(g, stats):
                advance(1, note=g)
                if on_group_done is not None:
                    on_group_done(g, stats)

            if executor == "inline":
                prev = None
                if threads > 1:
                    import torch
                    prev = torch.get_num_threads()
                    torch.set_num_threads(threads)
                try:
                    for g in todo:
                        g, ws, am = task_args(g)
                        st = apply.solve_group_to_part(str(adir), g, ws, qcfg.kind, qcfg.method, qcfg.method_opts(),
                                                       am, device)
                        finished(g, st)
                finally:
                    if prev is not None:
                        import torch
                        torch.set_num_threads(prev)
            elif executor == "ray":
                _run_ray(todo, task_args, adir, qcfg, workers, ray_address, device, threads, finished)
            else:
                raise ValueError(f"executor: expected 'ray' or 'inline', got {executor!r}")

        stats = {}
        for g in todo_all:
            _, st = store.read_part(store.part_path(adir, g))
            stats.update(st)
        errs = [stats[n]["rel_mse"] for n in names]
        manifest = {
            "hash": key, "model_identity": identity, "model": model_info or {},
            "format": qcfg.kind, "method": qcfg.method, "options": qcfg.artifact_key(),
            "modes": [m for m in ("w4a16", "w4a4", "w6a16", "w6a6", "w8a16", "w8a8") if m.startswith(f"w{qcfg.bits}a")],
            "groups": list(todo_all), "layers": {n: stats[n] for n in names}, "skipped": skipped,
            "rel_mse_mean": sum(errs) / len(errs), "rel_mse_max": max(errs),
            "bytes": _bytes(model, names, qcfg.kind), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        store.finalize(adir, manifest)
        return {**manifest, "artifact": str(adir), "computed_groups": len(todo), "resumed_groups": len(done),
                "quantize_s": time.perf_counter() - t0, "already_complete": False}


def _bytes(model, names, fmt) -> dict:
    from synodic.quant.formats import get_format
    mods = dict(model.named_modules())
    n = sum(mods[x].weight.numel() for x in names)
    dense = sum(mods[x].weight.numel() * mods[x].weight.element_size() for x in names)
    return {"params": n, "dense": dense, "packed": int(n * get_format(fmt).bits_per_element / 8)}


def _check_store_paths(store_root, adir: Path, lock: Path) -> None:
    """The store root and this artifact's entry must be directories and its lock a file (or absent): a file or
    folder of the other kind in the way is refused in one line naming where the store came from."""
    import os

    from synodic.config.errors import ConfigError
    from synodic.quant import store
    if store_root:
        key = f"pipeline.store={str(store_root)!r}"
    elif os.environ.get(store.STORE_ENV):
        key = f"{store.STORE_ENV}={os.environ[store.STORE_ENV]!r}"
    else:
        key = f"pipeline.store=null ({adir.parent})"
    for p, want in ((adir.parent, "directory"), (adir, "directory"), (lock, "file")):
        if p.exists() and p.is_dir() != (want == "directory"):
            raise ConfigError([f"{key}: {p} is a {'directory' if p.is_dir() else 'file'}; expected a {want} "
                               "(or nothing) there"])


def _run_ray(todo, task_args, adir, qcfg, workers, ray_address, device, threads, finished):
    from synodic.distributed.cluster import ray_session
    from synodic.quant.apply import solve_group_to_part
    with ray_session(ray_address, "pipeline.ray_address", num_cpus=workers * threads) as ray:
        gpu = 1.0 / workers if device == "cuda" else 0
        remote = ray.remote(num_cpus=threads, num_gpus=gpu, max_retries=1)(solve_group_to_part)
        pending, queue = {}, list(todo)
        while queue or pending:
            while queue and len(pending) < workers:  # at most `workers` groups' weights in flight
                g, ws, am = task_args(queue.pop(0))
                ws = {n: w.cpu() for n, w in ws.items()}
                ref = remote.remote(str(adir), g, ws, qcfg.kind, qcfg.method, qcfg.method_opts(), am,
                                    device, threads)
                pending[ref] = g
            ready, _ = ray.wait(list(pending), num_returns=1)
            for r in ready:
                finished(pending.pop(r), ray.get(r))


def run(cfg, run_dir: Path) -> dict:
    from rich.console import Console

    from synodic.config.errors import ConfigError
    from synodic.graph import DTYPES, load_model, resolve_device
    from synodic.quant.report import plot_layer_errors

    p, qcfg = cfg.pipeline, cfg.quant
    if qcfg.kind == "none":
        from synodic.quant.config import FORMAT_BITS
        raise ConfigError([f"quant.kind='none' with pipeline=quantize: expected quant=<format>, one of "
                           f"{', '.join(FORMAT_BITS)}"])
    import torch
    if p.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["pipeline.device='cuda': no CUDA device on this machine; expected cpu or auto"])
    device = p.device if p.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if p.export_hf is not None:  # everything the export needs is checked before any solving
        from synodic.quant.export_ct import export_problems
        bad = export_problems(qcfg, str(cfg.model.weights), p.export_hf, p.overwrite)
        if bad:
            raise ConfigError(bad)
    torch.manual_seed(cfg.runtime.seed)
    model_dev = resolve_device(cfg.runtime)
    model, ckpt = load_model(cfg.model, model_dev, DTYPES[cfg.model.dtype])
    info = {"kind": cfg.model.kind, "weights": str(ckpt or cfg.model.weights), "dtype": cfg.model.dtype,
            "seed": cfg.model.seed, "overrides": dict(cfg.model.overrides)}
    con = Console()
    res = quantize_to_store(model, qcfg, p.store, executor=p.executor, workers=p.workers, ray_address=p.ray_address,
                            device=device, threads=p.threads, overwrite=p.overwrite, model_info=info)
    errs = {n: v["rel_mse"] for n, v in res["layers"].items()}
    plot_layer_errors({f"{qcfg.kind} {qcfg.method}": errs}, Path(run_dir) / "quant_error.png")
    state = "already complete" if res["already_complete"] else (
        f"{res['computed_groups']} groups solved"
        + (f", {res['resumed_groups']} resumed" if res["resumed_groups"] else ""))
    msg = (f"quantize: {qcfg.kind} {qcfg.method}, {len(errs)} linears, {state} in {res['quantize_s']:.1f}s; "
           f"mean rel. MSE {res['rel_mse_mean']:.3e} (max {res['rel_mse_max']:.3e}); artifact {res['artifact']}")
    con.print(msg)
    log.info(msg)
    if p.export_hf is not None:
        from synodic.quant.export_ct import export_hf
        res["export_hf"] = export_hf(res["artifact"], ckpt, p.export_hf, overwrite=p.overwrite)
        ex = res["export_hf"]
        line = (f"export_hf: {ex['format']} folder {ex['out']}: {len(ex['quantized'])} modules packed"
                + (f", {len(ex['dense'])} written dense (exact; see the log)" if ex["dense"] else "")
                + (f", {sum(len(g['requantized']) for g in ex['shared_scale'].values())} re-quantized to share one "
                   f"NVFP4 global scale per vLLM fused group" if ex["shared_scale"] else "")
                + (f"; {len(ex['vllm_fused_scale_mismatch'])} fused groups with differing global scales (vLLM "
                   "needs them shared; see the log)" if ex["vllm_fused_scale_mismatch"] else ""))
        con.print(line)
        log.info(line)
    metrics = {k: res[k] for k in ("rel_mse_mean", "rel_mse_max", "quantize_s", "computed_groups", "resumed_groups")}
    metrics["layers"] = len(errs)
    return {"quant": res, "artifact": res["artifact"], "metrics": metrics}
