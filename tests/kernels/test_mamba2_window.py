"""mamba2_decode_window: Triton kernel vs torch reference vs the eager reference applied T times."""
import pytest
import torch
from kernel_errors import rel_rmse
from synodic.kernels.mamba2_decode import mamba2_decode, mamba2_decode_ref
from synodic.kernels.mamba2_window import mamba2_decode_window, mamba2_decode_window_ref

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
NUM_SLOTS = 14
# batch 4: row 0 reuses its source slot at t = 0, row 1 is padding (its dst slot 13 must stay
# untouched), row 2 stores into its source slot at t = 2, row 3 skips the store at t = 1 (dst -1).
SRC = [3, -1, 0, 5]
DST = [[3, 7, 8, 12], [13, 13, 13, 13], [9, 10, 0, 11], [1, -1, 2, 4]]




def make_window(batch, T, H, P, N, G, dtype, device, gen, with_z):
    def rnd(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    BC = rnd(batch, T, 2, G, N).to(dtype)  # B, C as strided views of one projection, like a model
    return dict(
        x=rnd(batch, T, H, P).to(dtype).to(device),
        dt=rnd(batch, T, H, scale=0.7, shift=-1.0).to(device),
        B=BC[:, :, 0].to(device),
        C=BC[:, :, 1].to(device),
        z=rnd(batch, T, H, P).to(dtype).to(device) if with_z else None,
    )


def make_params(H, device, gen):
    return dict(
        A=(-torch.rand(H, generator=gen) * 2 - 0.1).to(device),
        D=torch.randn(H, generator=gen).to(device),
        dt_bias=(torch.randn(H, generator=gen) * 0.5).to(device),
    )


def eager_sequence(state, inp, prm, src, dst):
    """The existing eager reference applied T times to scratch copies of the source states; each
    position's state then copied to its dst slot. Returns y [b, T, H, P] fp32, updates `state`."""
    batch, T = inp["x"].shape[:2]
    scratch = state[src.clamp_min(0).long()].clone()
    ids = torch.where(src >= 0, torch.arange(batch, device=src.device), -1)
    ys = []
    for t in range(T):
        step = {k: (None if v is None else v[:, t]) for k, v in inp.items()}
        ys.append(mamba2_decode_ref(scratch, **step, **prm, slot_ids=ids).float())
        for b in range(batch):
            if src[b] >= 0 and dst[b, t] >= 0:
                state[dst[b, t]] = scratch[b]
    return torch.stack(ys, 1)


CASES = [  # (H, P, N, G, state dtype, T, with z)
    (3, 5, 7, 1, torch.float32, 3, True),
    (6, 4, 8, 3, torch.float32, 4, False),
    (3, 5, 7, 1, torch.bfloat16, 4, False),
    (6, 4, 8, 3, torch.bfloat16, 3, True),
    (3, 5, 7, 1, torch.float32, 1, False),
]


@pytest.mark.parametrize("H,P,N,G,sdtype,T,with_z", CASES)
def test_window_matches_ref_and_eager_sequence(H, P, N, G, sdtype, T, with_z, device):
    gen = torch.Generator().manual_seed(1000 * H + 10 * N + T)
    idt = torch.int32 if G == 1 else torch.int64
    src = torch.tensor(SRC, dtype=idt, device=device)
    dst = torch.tensor(DST, dtype=idt, device=device)[:, :T]
    xdtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    state0 = torch.randn(NUM_SLOTS, H, P, N, generator=gen).to(sdtype).to(device)
    s_tri, s_ref, s_seq = state0.clone(), state0.clone(), state0.clone()
    prm = make_params(H, device, gen)
    inp = make_window(4, T, H, P, N, G, xdtype, device, gen, with_z)
    out = torch.full((4, T, H, P), float("nan"), dtype=xdtype, device=device)
    y = mamba2_decode_window(s_tri, **inp, **prm, src_ids=src, dst_ids=dst, out=out, backend="triton")
    y_ref = mamba2_decode_window(s_ref, **inp, **prm, src_ids=src, dst_ids=dst, backend="ref")
    y_seq = eager_sequence(s_seq, inp, prm, src, dst)
    assert y is out and y.dtype == xdtype and y_ref.dtype == xdtype and torch.isfinite(y).all()
    assert (y[1] == 0).all() and (y_ref[1] == 0).all()
    # the reference is the eager step applied T times, to the bit
    assert torch.equal(y_ref, y_seq.to(xdtype)) and torch.equal(s_ref, s_seq)
    assert rel_rmse(y, y_ref) < TOL[sdtype]
    assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    written = {int(d) for r in (0, 2, 3) for d in DST[r][:T] if d >= 0}
    for s in range(NUM_SLOTS):
        if s not in written:  # sources only read, padding row's dst, unused slots: bit-identical
            assert torch.equal(s_tri[s], state0[s]) and torch.equal(s_ref[s], state0[s]), s
        else:
            assert not torch.equal(s_tri[s], state0[s]), s


@pytest.mark.parametrize("backend", ["triton", "ref"])
@pytest.mark.parametrize("sdtype", [torch.float32, torch.bfloat16])
def test_t1_dst_src_equals_decode(backend, sdtype, device):
    gen = torch.Generator().manual_seed(17)
    H, P, N, G = 6, 4, 8, 3
    ids = torch.tensor([2, -1, 0], device=device)
    xdtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    s_dec = torch.randn(5, H, P, N, generator=gen).to(sdtype).to(device)
    s_win = s_dec.clone()
    prm = make_params(H, device, gen)
    inp = make_window(3, 1, H, P, N, G, xdtype, device, gen, True)
    y_win = mamba2_decode_window(s_win, **inp, **prm, src_ids=ids, dst_ids=ids[:, None], backend=backend)
    step = {k: v[:, 0] for k, v in inp.items()}
    y_dec = mamba2_decode(s_dec, **step, **prm, slot_ids=ids, backend=backend)
    assert torch.equal(y_win[:, 0], y_dec) and torch.equal(s_win, s_dec)


def test_triton_multi_tile_and_allocated_output(device):
    """P split over several programs (BLOCK_P=2 for P=5), y allocated by the op, int64 ids."""
    sdtype = torch.bfloat16
    from synodic.kernels.mamba2_window.triton_impl import mamba2_decode_window_triton

    gen = torch.Generator().manual_seed(7)
    H, P, N, G, T = 2, 5, 8, 1, 3
    src = torch.tensor([1, 4, -1], device=device)
    dst = torch.tensor([[1, 2, 3], [5, 6, 4], [0, 0, 0]], device=device)
    state0 = torch.randn(7, H, P, N, generator=gen).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    prm = make_params(H, device, gen)
    inp = make_window(3, T, H, P, N, G, torch.bfloat16, device, gen, True)
    args = (inp["x"], inp["dt"], prm["A"], inp["B"], inp["C"], prm["D"], prm["dt_bias"], src, dst, inp["z"])
    y = mamba2_decode_window_triton(s_tri, *args, block_p=2, num_warps=1)
    y_ref = mamba2_decode_window_ref(s_ref, *args)
    assert y.shape == (3, T, H, P) and y.dtype == torch.bfloat16
    assert rel_rmse(y, y_ref) < 1e-2 and (y[2] == 0).all()
    assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    assert torch.equal(s_tri[0], state0[0])


def test_auto_backend_on_cpu_is_ref_and_shape_errors():
    gen = torch.Generator().manual_seed(5)
    H, P, N, G, T = 2, 3, 4, 1, 2
    state = torch.randn(6, H, P, N, generator=gen)
    inp = make_window(2, T, H, P, N, G, torch.float32, "cpu", gen, False)
    prm = make_params(H, "cpu", gen)
    src, dst = torch.tensor([1, 0]), torch.tensor([[2, 3], [4, 5]])
    s2 = state.clone()
    y = mamba2_decode_window(state, **inp, **prm, src_ids=src, dst_ids=dst)
    assert torch.equal(y, mamba2_decode_window_ref(s2, **inp, **prm, src_ids=src, dst_ids=dst))
    assert torch.equal(state, s2)
    with pytest.raises(ValueError, match=r"^B: expected shape"):
        mamba2_decode_window(state, **dict(inp, B=inp["B"][..., :3]), **prm, src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^dt: expected shape \[batch, T, H\]"):
        mamba2_decode_window(state, **dict(inp, dt=inp["dt"][:, 0]), **prm, src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^x: expected shape \[batch, T, H, P\]"):
        mamba2_decode_window(state, **dict(inp, x=inp["x"][:, 0]), **prm, src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^dst_ids: expected shape \[batch, T\]"):
        mamba2_decode_window(state, **inp, **prm, src_ids=src, dst_ids=dst[:, :1])
    with pytest.raises(ValueError, match=r"^dst_ids: expected dtype"):
        mamba2_decode_window(state, **inp, **prm, src_ids=src, dst_ids=dst.float())
    with pytest.raises(ValueError, match=r"^backend"):
        mamba2_decode_window(state, **inp, **prm, src_ids=src, dst_ids=dst, backend="cuda")
