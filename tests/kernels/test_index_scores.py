"""index_scores: Triton kernel vs torch reference over odd tiny shapes (paged and contiguous keys, fp8 keys
with per-token scales, bf16 keys, bf16 and fp32 queries, a page table through the scratch page, key tiles
cut by T), the reference vs a float64 hand loop, and decode (paged) == prefill (contiguous) bits."""
import pytest
import torch
from kernel_errors import rel_rmse
from synodic.kernels.index_scores import index_scores, index_scores_ref


def make(N, H, D, P, bs, view, kdt, qdt, device, gen):
    q = torch.randn(N, H, D, generator=gen).to(qdt)
    w = torch.randn(N, H, generator=gen).to(qdt)
    k = torch.randn(P, bs, D, generator=gen)
    scale = None
    if kdt == torch.float8_e4m3fn:
        scale = torch.rand(P, bs, generator=gen) + 0.1
        k = (k * 100).clamp(-448, 448)
    keys = k.to(kdt)
    pages = torch.randint(0, P, (N, view), generator=gen, dtype=torch.int32)
    pages[0, -1] = P - 1  # the scratch page
    return [t.to(device) if t is not None else None for t in (q, w, keys, scale, pages)]


CASES = [  # N, H, D, P, bs, view, key dtype, query dtype
    (3, 3, 20, 7, 5, 4, torch.float8_e4m3fn, torch.bfloat16),   # T = 20: one partial key tile
    (2, 5, 9, 6, 3, 30, torch.bfloat16, torch.float32),          # T = 90: two tiles, fp32 IEEE dot
    (4, 17, 33, 9, 16, 9, torch.float8_e4m3fn, torch.float32),   # H, D past a power of two; T = 144
    (1, 16, 16, 4, 64, 2, torch.bfloat16, torch.bfloat16),
]


@pytest.mark.parametrize("N,H,D,P,bs,view,kdt,qdt", CASES)
def test_triton_matches_ref(N, H, D, P, bs, view, kdt, qdt, device):
    gen = torch.Generator().manual_seed(N * 100 + H)
    q, w, keys, scale, pages = make(N, H, D, P, bs, view, kdt, qdt, device, gen)
    out = index_scores(q, w, keys, scale, pages, backend="triton")
    ref = index_scores_ref(q, w, keys, scale, pages)
    assert out.shape == (N, view * bs) and out.dtype == torch.float32
    assert not out.isnan().any()
    assert rel_rmse(out, ref) <= 1e-5
    # contiguous keys (prefill): the same rows laid out flat give the same bits as the paged read
    r = N - 1
    flat = keys[pages[r].long()].flatten(0, 1)
    fs = None if scale is None else scale[pages[r].long()].flatten(0, 1)
    pre = index_scores(q, w, flat.contiguous(), fs, None, backend="triton")
    assert torch.equal(pre[r], out[r])


def test_ref_vs_float64_loop():
    gen = torch.Generator().manual_seed(3)
    q, w, keys, scale, pages = make(2, 3, 5, 4, 2, 3, torch.float8_e4m3fn, torch.float32, "cpu", gen)
    ref = index_scores_ref(q, w, keys, scale, pages)
    for n in range(2):
        for t in range(6):
            p, o = int(pages[n, t // 2]), t % 2
            k = keys[p, o].double()
            want = sum(float(w[n, j]) * max(0.0, float(q[n, j].double() @ k)) for j in range(3)) * float(scale[p, o])
            assert abs(float(ref[n, t]) - want) <= 1e-4 * max(1.0, abs(want))


def test_errors():
    q, w = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="w: expected shape"):
        index_scores(q, torch.zeros(2, 4), torch.zeros(5, 4))
    with pytest.raises(ValueError, match="keys: expected shape"):
        index_scores(q, w, torch.zeros(5, 2, 4))
    with pytest.raises(ValueError, match="scale: expected shape"):
        index_scores(q, w, torch.zeros(5, 4), torch.zeros(4))
    with pytest.raises(ValueError, match="pages: expected shape"):
        index_scores(q, w, torch.zeros(5, 2, 4), None, torch.zeros(3, 1, dtype=torch.int32))
