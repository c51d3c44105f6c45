"""write_keys_fp8: Triton kernel vs reference, bit for bit (codes and scales), on odd widths and row counts, with
all-zero rows, tiny and large magnitudes; rows land only where (page, offset) says."""
import pytest
import torch
from synodic.kernels.key_write import FP8_MAX, write_keys_fp8


@pytest.mark.parametrize("D,M,dtype", [(8, 1, torch.float32), (24, 7, torch.bfloat16), (128, 5, torch.float32),
                                       (37, 12, torch.float16)])
def test_triton_matches_ref_bitwise(D, M, dtype, device):
    gen = torch.Generator().manual_seed(D * 100 + M)
    pages, bs = 6, 4
    lo, hi = (-6, 4) if dtype == torch.float16 else (-30, 30)          # row magnitudes within the dtype's range
    k = torch.randn(M, D, generator=gen) * torch.logspace(lo, hi, M)[:, None]
    k[0, :] = 0.0 if M > 1 else k[0, :]
    k = k.to(dtype).to(device)
    flat = torch.randperm(pages * bs, generator=gen)[:M]
    page, off = (flat // bs).to(device), (flat % bs).to(device)
    outs = []
    for backend in ("triton", "ref"):
        keys = torch.full((pages, bs, D), 0.5, device=device).to(torch.float8_e4m3fn)
        scales = torch.full((pages, bs), -1.0, device=device)
        write_keys_fp8(keys, scales, page, off, k, backend=backend)
        outs.append((keys.view(torch.uint8), scales))
    (ka, sa), (kb, sb) = outs
    assert torch.equal(ka, kb) and torch.equal(sa, sb)
    written = torch.zeros(pages, bs, dtype=torch.bool)
    written[page.cpu(), off.cpu()] = True
    assert (sa.cpu()[~written] == -1).all() and (sa.cpu()[written] > 0).all()
    deq = kb.view(torch.float8_e4m3fn)[page, off].float() * sb[page, off][:, None]
    assert deq.abs().max() <= k.float().abs().max() * (1 + 2 ** -3)
    big = k.float().abs().amax(-1) / FP8_MAX > 1e-12   # rows whose scale is not the 1e-12 floor use the full range
    assert big.sum() >= M // 2
    assert (kb.view(torch.float8_e4m3fn)[page, off].float().abs().amax(-1)[big] == FP8_MAX).all()


def test_bad_input_names_the_argument():
    keys = torch.zeros(2, 4, 8).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scales: expected"):
        write_keys_fp8(keys, torch.zeros(2, 5), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                       torch.zeros(1, 8))
    with pytest.raises(ValueError, match="k: expected"):
        write_keys_fp8(keys, torch.zeros(2, 4), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                       torch.zeros(1, 9))


def test_ties_and_subnormals_round_to_nearest_even(device):
    """Scale exactly 1 (row max 448): every midpoint between adjacent e4m3 values, both signs, and the subnormals."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    pos = vals[(vals >= 0) & vals.isfinite()].unique().sort().values      # 0 .. 448
    mids = (pos[1:] + pos[:-1]) / 2
    row = torch.cat([torch.tensor([448.0]), mids, -mids, pos, -pos])
    k = row.view(1, -1).to(device)
    outs = []
    for backend in ("triton", "ref"):
        keys = torch.zeros(1, 1, row.numel(), device=device).to(torch.float8_e4m3fn)
        scales = torch.zeros(1, 1, device=device)
        zero = torch.zeros(1, dtype=torch.long, device=device)
        write_keys_fp8(keys, scales, zero, zero, k, backend=backend)
        outs.append(keys.view(torch.uint8))
    assert torch.equal(outs[0], outs[1])
