"""Fixtures shared by the ReplaySSM per-head kernel tests (decode and verify, Mamba-2 and GDN)."""
import torch
from kernel_errors import rel_max, rel_rmse
from synodic.kernels.replay_common import dequantize, quantize_rows_fp8, store_state

MODES = {  # name: (ckpt dtype, low-precision copy dtype)
    "fp32": (torch.float32, None),
    "dual_bf16": (torch.float32, torch.bfloat16),
    "dual_fp8": (torch.float32, torch.float8_e4m3fn),
    "single_fp8": (torch.float8_e4m3fn, None),
}


def fill_state(c, gen, shape, mode, amp):
    """Random checkpoint (fp8: quantised per row) and its low-precision copy; returns the state the
    cache now holds (dequantised for an fp8 checkpoint)."""
    ck, lo = MODES[mode]
    S = torch.randn(*shape, generator=gen) * amp
    if ck == torch.float8_e4m3fn:
        q, sc = quantize_rows_fp8(S)
        c["ckpt"].copy_(q)
        c["ckpt_scale"].copy_(sc)
        S = dequantize(q, sc)
    else:
        c["ckpt"].copy_(S)
    if lo is not None:
        store_state(c["ckpt_lo"], c.get("ckpt_lo_scale"), S)
    return S


def poison(c, keys):
    for key in keys:
        c[key].fill_(float("nan"))  # unwritten ring entries must never reach an output


def rows_for(step):
    """Slot 3 joins late (cursors differ inside one launch); padding rows; order shuffled."""
    rows = [2, 0, -1] if step < 2 else [0, 3, 2] if step % 2 else [3, -1, 2, 0]
    return torch.tensor(rows, dtype=torch.int32)


def check_checkpoints(c, c_ref, mode, step):
    """Decode per-head vs the reference after one step: the fp32 checkpoint exact, the bf16 copy within one
    ulp, fp8 states (dequantised) and their per-row scales close."""
    if MODES[mode][0] == torch.float32:
        assert rel_max(c["ckpt"], c_ref["ckpt"]) <= 1e-5, step
    if MODES[mode][1] == torch.bfloat16:
        # same RTNE rounding; an fp32 last-bit difference may flip one bf16 ulp
        torch.testing.assert_close(c["ckpt_lo"].float(), c_ref["ckpt_lo"].float(), rtol=2**-7, atol=1e-6)
    if MODES[mode][1] == torch.float8_e4m3fn or MODES[mode][0] == torch.float8_e4m3fn:
        key = "ckpt_lo" if MODES[mode][1] is not None else "ckpt"
        a = dequantize(c[key], c[key + "_scale"])
        b = dequantize(c_ref[key], c_ref[key + "_scale"])
        assert rel_rmse(a, b) <= 1e-3, step  # measured ~1e-7; room for a rare one-ulp flip
        torch.testing.assert_close(c[key + "_scale"], c_ref[key + "_scale"], rtol=1e-5, atol=0)
