"""Error measures the kernel tests compare a kernel with its reference by (float64, on the CPU)."""
import torch


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (relative RMSE)."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
