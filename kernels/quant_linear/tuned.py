"""Per-GPU launch configs for the packed kernels, tuned offline on the presets' linear shapes.

The heuristics of `launch.default_config` are fitted on a few shapes; the best K split and tile of a given
(N, K) differ by 5-20 % between shapes with no rule that fits them all (docs/tuning/quant_linear.md). As serving
engines do for their fused-MoE kernels, a table measured once per GPU (`python -m benchmarks.tune_quant`)
maps (format, N, K, row bucket) to the config that won; a call with no explicit config takes its entry when the
device's table has one, and the heuristic otherwise. The table is a file, not a run-time timing: decode steps
stay capturable in CUDA graphs and the same shapes always launch the same config.

File: `tuned/<device name, non-alphanumerics as _>.json`, {"meta": {...}, "configs": {"fmt,N,K,M": config},
"kgemm": {"fmt,N,K,M": config}}: "configs" for the kernels over the stored layout, "kgemm" for the plane-layout
GEMM (kgemm.py over kmajor.py; its own row buckets, GEMM_M_BUCKETS: 2-256 rows).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

TABLE_DIR = Path(__file__).parent / "tuned"
M_BUCKETS = (1, 2, 4, 16, 32)  # the row counts tuned; a call of M rows takes the first bucket >= M


GEMM_M_BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256)


def bucket(M: int) -> int | None:
    """The tuned row count that stands for a call of M rows (1 and 2 exactly: their kernels differ; 3-4 -> 4,
    5-16 -> 16, 17-32 -> 32); None above the last."""
    return next((b for b in M_BUCKETS if M <= b), None)


def key(fmt: str, N: int, K: int, M: int) -> str:
    return f"{fmt},{N},{K},{M}"


@lru_cache(maxsize=None)  # looked up on every packed-kernel call without a config
def table_path(device_name: str, root: Path | None = None) -> Path:
    return (root or TABLE_DIR) / (re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json")


@lru_cache(maxsize=None)
def load(path: Path, section: str = "configs") -> dict:
    """{key: config} of a table file's section ("configs" or "kgemm"; {} when there is none)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    configs = data.get(section, None if section == "configs" else {}) if isinstance(data, dict) else None
    if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
        raise ValueError(f"{path}: expected {{'meta': ..., {section!r}: {{'fmt,N,K,M': config}}}}")
    return configs


def lookup(device_name: str, fmt: str, N: int, K: int, M: int, root: Path | None = None) -> dict | None:
    """The tuned config for a call of M rows, or None (no table for this device, no entry for the shape)."""
    b = bucket(M)
    if b is None:
        return None
    entry = load(table_path(device_name, root or TABLE_DIR)).get(key(fmt, N, K, b))
    return dict(entry) if entry is not None else None


def gemm_bucket(M: int) -> int | None:
    """A GEMM's tuned row count for a call of M rows (the first of GEMM_M_BUCKETS >= M); None above 256."""
    return next((b for b in GEMM_M_BUCKETS if M <= b), None)


def lookup_gemm(device_name: str, fmt: str, N: int, K: int, M: int, root: Path | None = None,
                section: str = "kgemm") -> dict | None:
    """The tuned config for a call of M rows of a GEMM over its own layout (section "kgemm": kgemm.py over
    kmajor.py; GEMM_M_BUCKETS), or None."""
    b = gemm_bucket(M)
    if b is None:
        return None
    entry = load(table_path(device_name, root or TABLE_DIR), section).get(key(fmt, N, K, b))
    return dict(entry) if entry is not None else None
