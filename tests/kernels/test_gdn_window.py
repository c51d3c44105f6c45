"""gdn_decode_window: Triton kernel vs torch reference vs the eager reference applied T times."""
import pytest
import torch
import torch.nn.functional as F
from kernel_errors import rel_rmse
from synodic.kernels.gdn_decode import gdn_decode, gdn_decode_ref
from synodic.kernels.gdn_window import gdn_decode_window, gdn_decode_window_ref

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
NUM_SLOTS = 14
# batch 4: row 0 reuses its source slot at t = 0, row 1 is padding (its dst slot 13 must stay
# untouched), row 2 stores into its source slot at t = 2, row 3 skips the store at t = 1 (dst -1).
SRC = [3, -1, 0, 5]
DST = [[3, 7, 8, 12], [13, 13, 13, 13], [9, 10, 0, 11], [1, -1, 2, 4]]




def make_window(batch, T, HV, Hk, K, V, dtype, device, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    qk = rnd(batch, T, 2, Hk, K).to(dtype)  # q, k as strided views of one projection, like a model
    return dict(
        q=qk[:, :, 0].to(device),
        k=qk[:, :, 1].to(device),
        v=rnd(batch, T, HV, V).to(dtype).to(device),
        g=F.logsigmoid(rnd(batch, T, HV) + 2).to(device),
        beta=torch.sigmoid(rnd(batch, T, HV)).to(device),
    )


def eager_sequence(state, inp, src, dst, **kw):
    """The existing eager reference applied T times to scratch copies of the source states; each
    position's state then copied to its dst slot. Returns o [b, T, HV, V] fp32, updates `state`."""
    batch, T = inp["v"].shape[:2]
    scratch = state[src.clamp_min(0).long()].clone()
    ids = torch.where(src >= 0, torch.arange(batch, device=src.device), -1)
    os_ = []
    for t in range(T):
        step = {k: v[:, t] for k, v in inp.items()}
        os_.append(gdn_decode_ref(scratch, **step, slot_ids=ids, **kw).float())
        for b in range(batch):
            if src[b] >= 0 and dst[b, t] >= 0:
                state[dst[b, t]] = scratch[b]
    return torch.stack(os_, 1)


CASES = [  # (HV, Hk, K, V, state dtype, T, use_qk_l2norm, scale)
    (6, 3, 9, 5, torch.float32, 3, True, None),
    (6, 3, 9, 5, torch.float32, 4, False, 0.3),
    (6, 3, 9, 5, torch.bfloat16, 4, True, None),
    (4, 2, 16, 8, torch.bfloat16, 3, True, 0.5),
    (6, 3, 9, 5, torch.float32, 1, True, None),
]


@pytest.mark.parametrize("HV,Hk,K,V,sdtype,T,l2,scale", CASES)
def test_window_matches_ref_and_eager_sequence(HV, Hk, K, V, sdtype, T, l2, scale, device):
    gen = torch.Generator().manual_seed(100 * HV + K + T)
    idt = torch.int32 if l2 else torch.int64
    src = torch.tensor(SRC, dtype=idt, device=device)
    dst = torch.tensor(DST, dtype=idt, device=device)[:, :T]
    dtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    state0 = (torch.randn(NUM_SLOTS, HV, V, K, generator=gen) * 0.5).to(sdtype).to(device)
    s_tri, s_ref, s_seq = state0.clone(), state0.clone(), state0.clone()
    inp = make_window(4, T, HV, Hk, K, V, dtype, device, gen)
    kw = dict(scale=scale, use_qk_l2norm=l2)
    out = torch.full((4, T, HV, V), float("nan"), dtype=dtype, device=device)
    o = gdn_decode_window(s_tri, **inp, src_ids=src, dst_ids=dst, out=out, backend="triton", **kw)
    o_ref = gdn_decode_window(s_ref, **inp, src_ids=src, dst_ids=dst, backend="ref", **kw)
    o_seq = eager_sequence(s_seq, inp, src, dst, **kw)
    assert o is out and o.dtype == dtype and o_ref.dtype == dtype and torch.isfinite(o).all()
    assert (o[1] == 0).all() and (o_ref[1] == 0).all()
    # the reference is the eager step applied T times, to the bit
    assert torch.equal(o_ref, o_seq.to(dtype)) and torch.equal(s_ref, s_seq)
    assert rel_rmse(o, o_ref) < TOL[sdtype]
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
    gen = torch.Generator().manual_seed(23)
    HV, Hk, K, V = 6, 3, 9, 5
    ids = torch.tensor([2, -1, 0], device=device)
    dtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    s_dec = (torch.randn(4, HV, V, K, generator=gen) * 0.5).to(sdtype).to(device)
    s_win = s_dec.clone()
    inp = make_window(3, 1, HV, Hk, K, V, dtype, device, gen)
    o_win = gdn_decode_window(s_win, **inp, src_ids=ids, dst_ids=ids[:, None], backend=backend)
    step = {k: v[:, 0] for k, v in inp.items()}
    o_dec = gdn_decode(s_dec, **step, slot_ids=ids, backend=backend)
    assert torch.equal(o_win[:, 0], o_dec) and torch.equal(s_win, s_dec)


def test_triton_multi_tile_and_allocated_output(device):
    """V split over several programs (BLOCK_V=2 for V=5), o allocated by the op, int64 ids."""
    sdtype = torch.bfloat16
    from synodic.kernels.gdn_window.triton_impl import gdn_decode_window_triton

    gen = torch.Generator().manual_seed(11)
    HV, Hk, K, V, T = 2, 1, 16, 5, 3
    src = torch.tensor([1, 4, -1], device=device)
    dst = torch.tensor([[1, 2, 3], [5, 6, 4], [0, 0, 0]], device=device)
    state0 = torch.randn(7, HV, V, K, generator=gen).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    inp = make_window(3, T, HV, Hk, K, V, torch.bfloat16, device, gen)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], src, dst)
    o = gdn_decode_window_triton(s_tri, *args, block_v=2, num_warps=1)
    o_ref = gdn_decode_window_ref(s_ref, *args)
    assert o.shape == (3, T, HV, V) and o.dtype == torch.bfloat16
    assert rel_rmse(o, o_ref) < 1e-2 and (o[2] == 0).all()
    assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    assert torch.equal(s_tri[0], state0[0])


def test_auto_backend_on_cpu_is_ref_and_shape_errors():
    gen = torch.Generator().manual_seed(5)
    HV, Hk, K, V, T = 2, 1, 4, 3, 2
    state = torch.randn(6, HV, V, K, generator=gen)
    inp = make_window(2, T, HV, Hk, K, V, torch.float32, "cpu", gen)
    src, dst = torch.tensor([1, 0]), torch.tensor([[2, 3], [4, 5]])
    s2 = state.clone()
    o = gdn_decode_window(state, **inp, src_ids=src, dst_ids=dst)
    assert torch.equal(o, gdn_decode_window_ref(s2, **inp, src_ids=src, dst_ids=dst))
    assert torch.equal(state, s2)
    with pytest.raises(ValueError, match=r"^q: expected shape"):
        gdn_decode_window(state, **dict(inp, q=inp["q"][..., :3]), src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^g: expected shape \[batch, T, HV\]"):
        gdn_decode_window(state, **dict(inp, g=inp["g"][:, 0]), src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^v: expected shape \[batch, T, HV, V\]"):
        gdn_decode_window(state, **dict(inp, v=inp["v"][:, 0]), src_ids=src, dst_ids=dst)
    with pytest.raises(ValueError, match=r"^dst_ids: expected shape \[batch, T\]"):
        gdn_decode_window(state, **inp, src_ids=src, dst_ids=dst[:, :1])
    with pytest.raises(ValueError, match=r"^src_ids: expected dtype"):
        gdn_decode_window(state, **inp, src_ids=src.float(), dst_ids=dst)
    with pytest.raises(ValueError, match=r"^backend"):
        gdn_decode_window(state, **inp, src_ids=src, dst_ids=dst, backend="cuda")
