"""conv1d_update: Triton kernel vs torch reference (odd channel counts, widths 2..4, padding rows,
bf16 / fp32), a decode sequence equals the whole-sequence causal conv, argument errors."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.conv1d_update import conv1d_update, new_conv_state

from synodic.models.scan import causal_conv

CASES = [  # (C, width, state dtype, slot id dtype, bias, silu)
    (37, 4, torch.float32, torch.int64, True, True),
    (37, 2, torch.bfloat16, torch.int32, True, True),
    (200, 3, torch.bfloat16, torch.int64, False, True),
    (1100, 4, torch.bfloat16, torch.int32, True, False),  # two channel blocks, the last one partial
    (5, 3, torch.float32, torch.int32, False, False),
]


@pytest.mark.parametrize("tap_major", [False, True], ids=["channel-major", "tap-major"])
@pytest.mark.parametrize("C,W,dtype,idt,with_bias,silu", CASES)
def test_triton_matches_ref(C, W, dtype, idt, with_bias, silu, tap_major, device):
    gen = torch.Generator().manual_seed(C * 10 + W)
    num_slots = 6
    slot_ids = torch.tensor([4, -1, 0, 2, -1], dtype=idt, device=device)
    batch = slot_ids.shape[0]
    state0 = torch.randn(num_slots, C, W - 1, generator=gen).to(dtype).to(device)
    s_ref = state0.clone()
    s_tri = new_conv_state(num_slots, C, W - 1, dtype=dtype, device=device) if tap_major else state0.clone()
    if tap_major:  # the SSM backends' layout: [slots, C, W - 1] over memory [slots, W - 1, C]
        s_tri.copy_(state0)
        assert s_tri.stride(1) == 1
    w = (torch.randn(C, W, generator=gen) * 0.5).to(dtype).to(device)
    b = torch.randn(C, generator=gen).to(dtype).to(device) if with_bias else None
    for step in range(3):
        # x as a row-strided slice of a wider projection output, like the models pass it
        proj = torch.randn(batch, C + 9, generator=gen).to(dtype).to(device)
        x = proj[:, 4:4 + C]
        out = torch.full((batch, C), float("nan"), dtype=dtype, device=device) if step == 0 else None
        y = conv1d_update(x, s_tri, w, b, slot_ids, silu=silu, out=out, backend="triton")
        y_ref = conv1d_update(x, s_ref, w, b, slot_ids, silu=silu, backend="ref")
        assert y.dtype == dtype and y.shape == (batch, C) and (out is None or y is out)
        assert (y[1] == 0).all() and (y[4] == 0).all() and (y_ref[1] == 0).all()
        # fp32 accumulation vs the reference's bf16 products: a bf16 rounding or two apart
        assert rel_max(y, y_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
        assert torch.equal(s_tri, s_ref)  # the shift and the appended input are exact
    untouched = [1, 3, 5]
    assert torch.equal(s_tri[untouched], state0[untouched])


@pytest.mark.parametrize("W", [2, 4])
def test_decode_steps_equal_causal_conv(W, device):
    """Prefill's conv state then one conv1d_update per token = the whole-sequence causal conv."""
    gen = torch.Generator().manual_seed(W)
    C, T, t0 = 19, 7, 3
    x = torch.randn(2, T, C, generator=gen).to(device)
    w, b = torch.randn(C, W, generator=gen).to(device), torch.randn(C, generator=gen).to(device)
    y_full, _ = causal_conv(x, w, b)
    _, st = causal_conv(x[:, :t0], w, b)
    state = torch.zeros(4, C, W - 1, device=device)
    slots = torch.tensor([3, 1], device=device)
    state[slots] = st
    for t in range(t0, T):
        y = conv1d_update(x[:, t], state, w, b, slots, backend="triton")
        assert rel_max(y, y_full[:, t]) < 1e-5


def test_argument_errors():
    st, x, w = torch.zeros(3, 8, 3), torch.zeros(2, 8), torch.zeros(8, 4)
    ids = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="weight: expected shape"):
        conv1d_update(x, st, torch.zeros(8, 3), None, ids)
    with pytest.raises(ValueError, match="x: expected shape"):
        conv1d_update(torch.zeros(2, 7), st, w, None, ids)
    with pytest.raises(ValueError, match="slot_ids: expected dtype"):
        conv1d_update(x, st, w, None, ids.float())
    with pytest.raises(ValueError, match="conv_state: expected shape"):
        conv1d_update(x, st[0], w, None, ids)
    with pytest.raises(ValueError, match="backend"):
        conv1d_update(x, st, w, None, ids, backend="cuda")
