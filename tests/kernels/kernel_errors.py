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


def assert_elementwise_matches(y: torch.Tensor, y_ref: torch.Tensor) -> None:
    """An elementwise kernel vs its torch form, by y's dtype and device: bf16 bit for bit on the CPU (the interpreter
    rounds op for op as the torch form, no FMA); compiled, products and sums contract to FMAs, so one bf16 rounding
    apart at most; fp32 to rounding."""
    if y.dtype == torch.bfloat16 and y.device.type == "cpu":
        assert torch.equal(y, y_ref)
    elif y.dtype == torch.bfloat16:
        assert rel_max(y, y_ref) < 1e-2
    else:
        assert rel_max(y, y_ref) < 1e-6
