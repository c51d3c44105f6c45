"""gdn_decode: Triton kernel vs torch reference, reference vs a float64 hand loop."""
import math

import pytest
import torch
import torch.nn.functional as F
from kernel_errors import rel_rmse
from synodic.kernels.gdn_decode import gdn_decode, gdn_decode_ref

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}




def make_step(batch, HV, Hk, K, V, dtype, device, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    qk = rnd(batch, 2, Hk, K).to(dtype)  # q, k as strided views of one projection, like a model
    return dict(
        q=qk[:, 0].to(device),
        k=qk[:, 1].to(device),
        v=rnd(batch, HV, V).to(dtype).to(device),
        g=F.logsigmoid(rnd(batch, HV) + 2).to(device),
        beta=torch.sigmoid(rnd(batch, HV)).to(device),
    )


CASES = [  # (HV, Hk, K, V, state dtype, use_qk_l2norm, scale)
    (6, 3, 9, 5, torch.float32, True, None),
    (4, 4, 8, 6, torch.float32, False, 0.3),
    (6, 3, 9, 5, torch.bfloat16, True, None),
    (4, 2, 16, 8, torch.bfloat16, True, 0.5),
]


@pytest.mark.parametrize("HV,Hk,K,V,sdtype,l2,scale", CASES)
def test_triton_matches_ref(HV, Hk, K, V, sdtype, l2, scale, device):
    gen = torch.Generator().manual_seed(100 * HV + K)
    num_slots, batch = 5, 4
    slot_ids = torch.tensor([3, -1, 0, 2], dtype=torch.int32 if l2 else torch.int64, device=device)
    dtype = torch.float32 if sdtype == torch.float32 else torch.bfloat16
    state0 = (torch.randn(num_slots, HV, V, K, generator=gen) * 0.5).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    for _ in range(3):
        inp = make_step(batch, HV, Hk, K, V, dtype, device, gen)
        out = torch.full((batch, HV, V), float("nan"), dtype=dtype, device=device)
        o = gdn_decode(s_tri, **inp, slot_ids=slot_ids, scale=scale, use_qk_l2norm=l2, out=out,
                       backend="triton")
        o_ref = gdn_decode(s_ref, **inp, slot_ids=slot_ids, scale=scale, use_qk_l2norm=l2, backend="ref")
        assert o is out and o.dtype == dtype and torch.isfinite(o).all()
        assert (o[1] == 0).all() and (o_ref[1] == 0).all()
        assert rel_rmse(o, o_ref) < TOL[sdtype]
        assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    for s in (1, 4):  # slots not in the batch (and the padding row's) stay bit-identical
        assert torch.equal(s_tri[s], state0[s]) and torch.equal(s_ref[s], state0[s])
    assert not torch.equal(s_tri[3], state0[3])


@pytest.mark.parametrize("sdtype", [torch.float32, torch.bfloat16])
def test_triton_multi_tile_and_allocated_output(sdtype, device):
    """V split over several programs (BLOCK_V=2 for V=5), o allocated by the op."""
    from synodic.kernels.gdn_decode.triton_impl import gdn_decode_triton

    gen = torch.Generator().manual_seed(11)
    HV, Hk, K, V = 4, 2, 16, 5
    slot_ids = torch.tensor([1, 4, -1], device=device)
    state0 = torch.randn(6, HV, V, K, generator=gen).to(sdtype).to(device)
    s_tri, s_ref = state0.clone(), state0.clone()
    for _ in range(2):
        inp = make_step(3, HV, Hk, K, V, torch.bfloat16, device, gen)
        args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], slot_ids)
        o = gdn_decode_triton(s_tri, *args, block_v=2, num_warps=1)
        o_ref = gdn_decode_ref(s_ref, *args)
        assert rel_rmse(o, o_ref) < 1e-2 and (o[2] == 0).all()
        assert rel_rmse(s_tri, s_ref) < TOL[sdtype]
    assert torch.equal(s_tri[0], state0[0])


def test_ref_matches_float64_loop():
    gen = torch.Generator().manual_seed(4)
    HV, Hk, K, V, batch = 4, 2, 5, 3, 3
    slot_ids = torch.tensor([2, -1, 0])
    state = torch.randn(3, HV, V, K, generator=gen)
    S64 = state.double().clone()
    for _ in range(2):
        inp = make_step(batch, HV, Hk, K, V, torch.float32, "cpu", gen)
        o = gdn_decode(state, **inp, slot_ids=slot_ids, backend="ref")
        o64 = torch.zeros(batch, HV, V, dtype=torch.float64)
        q, k, v, g, beta = (inp[n].double() for n in ("q", "k", "v", "g", "beta"))
        for b in range(batch):
            s = int(slot_ids[b])
            if s < 0:
                continue
            for h in range(HV):
                hk = h // (HV // Hk)
                qn = [float(t) for t in q[b, hk]]
                kn = [float(t) for t in k[b, hk]]
                nq = math.sqrt(sum(t * t for t in qn) + 1e-6)
                nk = math.sqrt(sum(t * t for t in kn) + 1e-6)
                qn = [t / nq * K ** -0.5 for t in qn]
                kn = [t / nk for t in kn]
                alpha = math.exp(float(g[b, h]))
                for i in range(V):
                    row = [alpha * float(S64[s, h, i, j]) for j in range(K)]
                    u = float(beta[b, h]) * (float(v[b, h, i]) - sum(row[j] * kn[j] for j in range(K)))
                    row = [row[j] + u * kn[j] for j in range(K)]
                    S64[s, h, i] = torch.tensor(row, dtype=torch.float64)
                    o64[b, h, i] = sum(row[j] * qn[j] for j in range(K))
        assert rel_rmse(o, o64) < 1e-5
        assert rel_rmse(state, S64) < 1e-6
        assert (o[1] == 0).all()


def test_auto_backend_on_cpu_is_ref_and_shape_errors():
    gen = torch.Generator().manual_seed(5)
    HV, Hk, K, V = 2, 1, 4, 3
    state = torch.randn(2, HV, V, K, generator=gen)
    inp = make_step(2, HV, Hk, K, V, torch.float32, "cpu", gen)
    ids = torch.tensor([1, 0])
    s2 = state.clone()
    o = gdn_decode(state, **inp, slot_ids=ids)
    assert torch.equal(o, gdn_decode_ref(s2, **inp, slot_ids=ids)) and torch.equal(state, s2)
    with pytest.raises(ValueError, match=r"^k: expected shape \[batch, Hk, K\]"):
        gdn_decode(state, **dict(inp, k=inp["k"][..., :3]), slot_ids=ids)
    with pytest.raises(ValueError, match=r"^q: expected shape"):
        gdn_decode(state, **dict(inp, q=inp["q"].expand(2, 3, K)), slot_ids=ids)
    with pytest.raises(ValueError, match=r"^beta"):
        gdn_decode(state, **dict(inp, beta=inp["beta"][:1]), slot_ids=ids)
    with pytest.raises(ValueError, match=r"^backend"):
        gdn_decode(state, **inp, slot_ids=ids, backend="fla")
