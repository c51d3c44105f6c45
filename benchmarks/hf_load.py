"""Load time of a Hugging Face NemotronH folder: synodic's streaming loader (synodic/models/hf) against
safetensors reading the same shards to the same device.

    python -m benchmarks.hf_load --dir /tmp/nemotron_h_8b_hf --out hf_load.json

Writes an 8B-shaped random NemotronH folder (shapes of the nemotron_h_8b preset, bf16, Hub tensor names
`backbone.*`, `hybrid_override_pattern`, shards of --shard-gb with model.safetensors.index.json) into
--dir unless one is already there, reads every shard once (so both timings see the same page cache),
then times, best of --reps: `safetensors` safe_open(device=...) reading every tensor to the device, and
`synodic.models.weights.load_checkpoint(dir, device, bfloat16)`, with the ratio (target <= 1.5) and
the loader's peak anonymous host memory (a spawned process, above its state after device
start-up; target < 2 GiB beyond the page cache). --layers N keeps the first N layers (a small run for tests).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

import torch

from benchmarks._cli import nonnegative_int, out_file, positive_float, positive_int


def hub_config(cfg) -> dict:
    """A Hub-style NemotronH config.json for HybridConfig `cfg` (the spelling published checkpoints use)."""
    return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "hybrid_override_pattern": cfg.hybrid_override_pattern,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "mamba_num_heads": cfg.mamba_num_heads, "mamba_head_dim": cfg.mamba_head_dim,
            "ssm_state_size": cfg.ssm_state_size, "n_groups": cfg.n_groups, "conv_kernel": cfg.conv_kernel,
            "chunk_size": cfg.chunk_size, "layer_norm_epsilon": cfg.rms_norm_eps, "mlp_hidden_act": "relu2",
            "mamba_hidden_act": "silu", "use_bias": False, "use_conv_bias": True,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "eos_token_id": 2, "bos_token_id": 1}


def folder_bytes(cfg) -> int:
    """Bytes of the bf16 tensors write_folder writes for `cfg`."""
    from synodic.models.hf.nemotron_h import sources
    return sum(torch.Size(src.shape).numel() * 2 for src in sources(cfg, "backbone.").values())


def write_folder(cfg, out: Path, shard_bytes: int, device: str, seed: int = 0) -> int:
    """Random bf16 tensors under NemotronH's Hub names, shard by shard (one shard in host memory at a time)."""
    from safetensors.torch import save_file

    from synodic.models.hf.nemotron_h import sources
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(seed)
    names = sources(cfg, "backbone.")
    groups, cur, size = [], [], 0
    for name, src in names.items():
        n = torch.Size(src.shape).numel() * 2
        if cur and size + n > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += n
    groups.append(cur)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        print(f"writing {out / fname} ({i + 1} of {len(groups)})", file=sys.stderr, flush=True)
        tensors = {}
        for name in group:
            t = torch.empty(names[name].shape, device=device, dtype=torch.bfloat16)
            if name.endswith(("A_log", "dt_bias", "D")) or "norm" in name:
                t.uniform_(0.5, 1.5, generator=g)
            else:
                t.normal_(0, 0.02, generator=g)
            tensors[name] = t.cpu()
            weight_map[name] = fname
            total += t.numel() * 2
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(hub_config(cfg), indent=1))
    return total


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def read_safetensors(folder: Path, device: str) -> float:
    from safetensors import safe_open
    dev = "cuda:0" if torch.device(device).type == "cuda" else "cpu"
    _sync(device)
    t0 = time.perf_counter()
    held = []
    for shard in sorted(folder.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="pt", device=dev) as f:
            held += [f.get_tensor(k) for k in f.keys()]
    _sync(device)
    dt = time.perf_counter() - t0
    del held
    return dt


def load_synodic(folder: Path, device: str) -> float:
    from synodic.models.weights import load_checkpoint
    _sync(device)
    t0 = time.perf_counter()
    model = load_checkpoint(folder, device, torch.bfloat16, progress=False)
    _sync(device)
    dt = time.perf_counter() - t0
    del model
    return dt


def _rss_anon() -> int:
    """This process's anonymous resident bytes (heap, pinned staging; not the page cache's file pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def _host_peak_child(folder: str, device: str, q) -> None:
    """In a fresh process: peak anonymous host memory of one load, above the process's state after the device
    is initialised (a CUDA context alone holds several hundred MB), sampled every 5 ms."""
    import threading
    torch.zeros(1, device=device)
    base = _rss_anon()
    peak, done = [base], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon())
            time.sleep(0.005)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    load_synodic(Path(folder), device)
    done.set()
    th.join()
    q.put((base, max(peak[0], _rss_anon())))


def host_peak(folder: Path, device: str) -> tuple[int, int]:
    """(baseline, peak) anonymous host bytes of load_checkpoint in a spawned process (this one has written the
    folder and read it through safetensors, so its own peak says nothing about the loader)."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_host_peak_child, args=(str(folder), device, q))
    p.start()
    out = q.get()
    p.join()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="the HF folder to write (or reuse when config.json is there)")
    ap.add_argument("--out", type=out_file, default="hf_load.json")
    ap.add_argument("--preset", default="nemotron_h_8b")
    ap.add_argument("--layers", type=nonnegative_int, default=0, help="keep the first N layers (0: all)")
    ap.add_argument("--shard-gb", type=positive_float, default=5.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=positive_int, default=2)
    a = ap.parse_args(argv)
    from synodic.models.presets import PRESETS
    if a.preset not in PRESETS:
        ap.error(f"argument --preset: invalid value {a.preset!r}; expected one of {', '.join(sorted(PRESETS))}")
    if Path(a.dir).exists() and not Path(a.dir).is_dir():
        ap.error(f"argument --dir: invalid value {a.dir!r}; expected a directory (it is a file)")
    cfg = PRESETS[a.preset]
    if a.layers:
        p = cfg.hybrid_override_pattern[:a.layers]
        cfg = cfg.model_copy(update={"num_hidden_layers": len(p), "hybrid_override_pattern": p})
    folder = Path(a.dir)
    t0 = time.perf_counter()
    if not (folder / "config.json").is_file():
        need, root = folder_bytes(cfg), folder
        while not root.exists():
            root = root.parent
        free = shutil.disk_usage(root).free
        if need > free:  # (a full disk mid-write leaves a broken folder and a failing machine)
            ap.error(f"argument --dir: invalid value {a.dir!r}: {a.preset} takes {need / 1e9:.1f} GB and {root} has "
                     f"{free / 1e9:.1f} GB free; expected a folder with room, or --layers N for fewer layers")
        write_folder(cfg, folder, int(a.shard_gb * 2 ** 30), a.device)
    write_s = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in folder.glob("model-*.safetensors"))
    for p in folder.glob("model-*.safetensors"):  # into the page cache for both timings
        with open(p, "rb") as f:
            while f.read(1 << 26):
                pass
    st = min(read_safetensors(folder, a.device) for _ in range(a.reps))
    sy = min(load_synodic(folder, a.device) for _ in range(a.reps))
    base, peak = host_peak(folder, a.device)
    res = {"preset": a.preset, "layers": cfg.num_hidden_layers, "device": a.device,
           "gpu": torch.cuda.get_device_name() if torch.device(a.device).type == "cuda" else None,
           "bytes": nbytes, "shards": len(list(folder.glob("model-*.safetensors"))), "write_s": write_s,
           "safetensors_read_s": st, "synodic_load_s": sy, "ratio": sy / st, "target_ratio": 1.5,
           "safetensors_gbs": nbytes / st / 1e9, "synodic_gbs": nbytes / sy / 1e9,
           "load_host_anon_gib": (peak - base) / 2 ** 30, "target_host_gib": 2.0,
           "process_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}
    print(json.dumps(res, indent=1))
    Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
