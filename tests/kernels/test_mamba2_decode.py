"""mamba2_decode: Triton kernel vs torch reference, reference vs a float64 hand loop."""
import math

import pytest
import torch
from kernel_errors import rel_rmse
from synodic.kernels.mamba2_decode import mamba2_decode, mamba2_decode_ref

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}




def make_step(batch, H, P, N, G, dtype, device, gen, with_z):
    def rnd(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    BC = rnd(batch, 2, G, N).to(dtype)  # B, C as strided views of one projection, like a model
    return dict(
        x=rnd(batch, H, P).to(dtype).to(device),
        dt=rnd(batch, H, scale=0.7, shift=-1.0).to(device),
        B=BC[:, 0].to(device),
        C=BC[:, 1].to(device),
        z=rnd(batch, H, P).to(dtype).to(device) if with_z else None,
    )


def make_params(H, device, gen):
    return dict(
        A=(-torch.rand(H, generator=gen) * 2 - 0.1).to(device),
        D=torch.randn(H, generator=gen).to(device),
        dt_bias=(torch.randn(H, generator=gen) * 0.5).to(device),
    )


CASES = [  # (H, P, N, G, state dtype, with z)
    (3, 5, 7, 1, torch.float32, True),
    (6, 4, 8, 3, torch.float32, False),
    (3, 5, 7, 1, torch.bfloat16, False),
    (6, 4, 8, 3, torch.bfloat16, True),
]


@pytest.mark.parametrize("H,P,N,G,sdtype,with_z", CASES)
def test_triton_matches_ref(H, P, N, G, sdtype, with_z, device):
    gen = torch.Generator().manual_seed(1000 * H + N)
    num_slots, batch = 5, 4
    slot_ids = torch.tensor([3, -1, 0, 2], dtype=torch.int32 if G == 1 else torch.int64, device=device)
    xdtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    state0 = torch.randn(num_slots, H, P, N, generator=gen).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    prm = make_params(H, device, gen)
    for _ in range(3):
        inp = make_step(batch, H, P, N, G, xdtype, device, gen, with_z)
        out = torch.full((batch, H, P), float("nan"), dtype=xdtype, device=device)
        y = mamba2_decode(s_tri, **inp, **prm, slot_ids=slot_ids, out=out, backend="triton")
        y_ref = mamba2_decode(s_ref, **inp, **prm, slot_ids=slot_ids, backend="ref")
        assert y is out and y.dtype == xdtype and torch.isfinite(y).all()
        assert (y[1] == 0).all() and (y_ref[1] == 0).all()
        assert rel_rmse(y, y_ref) < TOL[sdtype]
        assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    for s in (1, 4):  # slots not in the batch (and the padding row's) stay bit-identical
        assert torch.equal(s_tri[s], state0[s]) and torch.equal(s_ref[s], state0[s])
    assert not torch.equal(s_tri[3], state0[3])


@pytest.mark.parametrize("sdtype", [torch.float32, torch.bfloat16])
def test_triton_multi_tile_and_allocated_output(sdtype, device):
    """P split over several programs (BLOCK_P=2 for P=5), y allocated by the op."""
    from synodic.kernels.mamba2_decode.triton_impl import mamba2_decode_triton

    gen = torch.Generator().manual_seed(7)
    H, P, N, G = 4, 5, 16, 2
    slot_ids = torch.tensor([1, 4, -1], device=device)
    state0 = torch.randn(6, H, P, N, generator=gen).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    prm = make_params(H, device, gen)
    for _ in range(2):
        inp = make_step(3, H, P, N, G, torch.bfloat16, device, gen, True)
        args = (inp["x"], inp["dt"], prm["A"], inp["B"], inp["C"], prm["D"], prm["dt_bias"], slot_ids,
                inp["z"])
        y = mamba2_decode_triton(s_tri, *args, block_p=2, num_warps=1)
        y_ref = mamba2_decode_ref(s_ref, *args)
        assert rel_rmse(y, y_ref) < 1e-2 and (y[2] == 0).all()
        assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    assert torch.equal(s_tri[0], state0[0])


def _softplus64(v: float) -> float:
    return v if v > 20 else math.log1p(math.exp(v))


def test_ref_matches_float64_loop():
    gen = torch.Generator().manual_seed(3)
    H, P, N, G, batch = 4, 3, 4, 2, 3
    slot_ids = torch.tensor([2, -1, 0])
    state = torch.randn(3, H, P, N, generator=gen)
    S64 = state.double().clone()
    prm = make_params(H, "cpu", gen)
    for _ in range(2):
        inp = make_step(batch, H, P, N, G, torch.float32, "cpu", gen, True)
        y = mamba2_decode(state, **inp, **prm, slot_ids=slot_ids, backend="ref")
        y64 = torch.zeros(batch, H, P, dtype=torch.float64)
        x, dt, B, C, z = (inp[k].double() for k in ("x", "dt", "B", "C", "z"))
        A, D, bias = (prm[k].double() for k in ("A", "D", "dt_bias"))
        for b in range(batch):
            s = int(slot_ids[b])
            if s < 0:
                continue
            for h in range(H):
                g = h // (H // G)
                d = _softplus64(float(dt[b, h] + bias[h]))
                dA = math.exp(d * float(A[h]))
                for p in range(P):
                    acc = 0.0
                    for n in range(N):
                        S64[s, h, p, n] = S64[s, h, p, n] * dA + d * x[b, h, p] * B[b, g, n]
                        acc += float(S64[s, h, p, n] * C[b, g, n])
                    zz = float(z[b, h, p])
                    y64[b, h, p] = (acc + float(D[h] * x[b, h, p])) * zz / (1 + math.exp(-zz))
        assert rel_rmse(y, y64) < 1e-5
        assert rel_rmse(state, S64) < 1e-6
        assert (y[1] == 0).all()


def test_auto_backend_on_cpu_is_ref_and_shape_errors():
    gen = torch.Generator().manual_seed(5)
    H, P, N, G = 2, 3, 4, 1
    state = torch.randn(2, H, P, N, generator=gen)
    inp = make_step(2, H, P, N, G, torch.float32, "cpu", gen, False)
    prm = make_params(H, "cpu", gen)
    ids = torch.tensor([1, 0])
    s2 = state.clone()
    y = mamba2_decode(state, **inp, **prm, slot_ids=ids)
    assert torch.equal(y, mamba2_decode_ref(s2, **inp, **prm, slot_ids=ids)) and torch.equal(state, s2)
    bad = dict(inp, B=inp["B"][:, :, :3])
    with pytest.raises(ValueError, match=r"^B: expected shape"):
        mamba2_decode(state, **bad, **prm, slot_ids=ids)
    with pytest.raises(ValueError, match=r"^dt: expected shape \[batch, H\]"):
        mamba2_decode(state, **dict(inp, dt=inp["dt"][:, :1]), **prm, slot_ids=ids)
    with pytest.raises(ValueError, match=r"^slot_ids"):
        mamba2_decode(state, **inp, **prm, slot_ids=ids[:1])
    with pytest.raises(ValueError, match=r"^backend"):
        mamba2_decode(state, **inp, **prm, slot_ids=ids, backend="cuda")
