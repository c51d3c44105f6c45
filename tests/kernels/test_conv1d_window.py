"""conv1d_window / conv1d_window_commit: Triton kernels vs torch references (odd channel counts, widths 2..4,
windows of 1..5, repeated scratch rows, bf16 / fp32, strided x), the window equals conv1d_update steps, and a
commit leaves the state conv1d_update would after the accepted tokens."""
import pytest
import torch
from kernel_errors import rel_max
from synodic.kernels.conv1d_update import conv1d_update, new_conv_state
from synodic.kernels.conv1d_window import conv1d_window, conv1d_window_commit

CASES = [  # (C, width, T, dtype, bias, silu)
    (37, 4, 4, torch.float32, True, True),
    (37, 2, 1, torch.bfloat16, True, True),
    (200, 3, 5, torch.bfloat16, False, True),
    (1100, 4, 3, torch.bfloat16, True, False),  # two channel blocks, the last one partial
    (5, 3, 2, torch.float32, False, False),
]


def _setup(C, W, T, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.tensor([4, 6, 0, 2, 6], device=device)  # 6: the scratch row, shared by padding rows
    state = new_conv_state(7, C, W - 1, dtype=dtype, device=device)
    state.copy_(torch.randn(7, C, W - 1, generator=gen).to(dtype))
    proj = torch.randn(rows.shape[0], T, C + 9, generator=gen).to(dtype).to(device)
    x = proj[..., 4:4 + C]  # a strided slice of a wider projection, as the models pass it
    w = (torch.randn(C, W, generator=gen) * 0.5).to(dtype).to(device)
    return gen, rows, state, x, w


@pytest.mark.parametrize("C,W,T,dtype,with_bias,silu", CASES)
def test_window_matches_ref(C, W, T, dtype, with_bias, silu, device):
    gen, rows, state, x, w = _setup(C, W, T, dtype, device, C * 10 + W)
    b = torch.randn(C, generator=gen).to(dtype).to(device) if with_bias else None
    s0 = state.clone()
    y = conv1d_window(x, state, w, b, rows, silu=silu, backend="triton")
    y_ref = conv1d_window(x, state, w, b, rows, silu=silu, backend="ref")
    assert y.shape == (5, T, C) and y.dtype == dtype
    # fp32 accumulation vs the reference's products in the state's dtype: a bf16 rounding or two apart
    assert rel_max(y, y_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert torch.equal(state, s0)  # the window writes no state


@pytest.mark.parametrize("C,W,T,dtype,with_bias,silu", CASES)
def test_commit_matches_ref(C, W, T, dtype, with_bias, silu, device):
    gen, rows, s_tri, x, w = _setup(C, W, T, dtype, device, C + W)
    rows = rows[:4]  # distinct rows (the scratch row once): the reference's index_copy_ has one writer a row
    x = x[:4]
    accepted = torch.randint(1, T + 1, (4,), generator=gen).to(device)
    s_ref = s_tri.clone()
    conv1d_window_commit(x, s_tri, rows, accepted, backend="triton")
    conv1d_window_commit(x, s_ref, rows, accepted, backend="ref")
    assert torch.equal(s_tri, s_ref)  # pure copies: exact


@pytest.mark.parametrize("backend", ["triton", "ref"])
def test_window_then_commit_equals_decode_steps(backend, device):
    """The window's outputs are conv1d_update's over the same tokens, and committing a tokens leaves the state
    a conv1d_update steps leave."""
    C, W, T = 19, 4, 4
    gen, rows, state, x, w = _setup(C, W, T, torch.float32, device, 3)
    rows, x = rows[:4], x[:4].contiguous()
    b = torch.randn(C, generator=gen).to(device)
    accepted = torch.tensor([1, 4, 2, 3], device=device)
    y = conv1d_window(x, state, w, b, rows, backend=backend)
    stepped = state.clone()
    ys = [conv1d_update(x[:, t], stepped, w, b, rows, backend="ref") for t in range(T)]
    assert rel_max(y, torch.stack(ys, 1)) < 1e-5
    want = state.clone()
    for i, a in enumerate(accepted.tolist()):
        for t in range(a):
            conv1d_update(x[i:i + 1, t], want, w, b, rows[i:i + 1], backend="ref")
    conv1d_window_commit(x, state, rows, accepted, backend=backend)
    assert torch.equal(state, want)


def test_errors(device):
    _, rows, state, x, w = _setup(8, 3, 2, torch.float32, device, 0)
    with pytest.raises(ValueError, match="weight"):
        conv1d_window(x, state, w[:, :2], None, rows)
    with pytest.raises(ValueError, match="x: expected shape"):
        conv1d_window(x[..., :5], state, w, None, rows)
    with pytest.raises(ValueError, match="accepted"):
        conv1d_window_commit(x, state, rows, rows[:2])
