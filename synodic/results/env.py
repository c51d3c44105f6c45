"""The environment a result was produced in."""
import platform
import subprocess
from pathlib import Path

import torch


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: torch.device | None = None) -> dict:
    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    dev = str(device) if device is not None else "cpu"
    on_gpu = device is not None and device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_gpu else platform.processor() or platform.machine()
    return {"device": dev, "device_name": name, "torch": torch.__version__, "triton": triton_v,
            "python": platform.python_version(), "git_commit": git_commit()}
