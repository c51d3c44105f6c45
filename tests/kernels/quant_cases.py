"""Inputs of the plane-layout GEMM tests (test_quant_kgemm): the formats the layout holds and one seeded weight /
activation / scale / bias set."""
import torch

FORMATS = ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")


def make(N, K, M, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(K, generator=gen))  # uneven columns
    x = torch.randn(M, K, generator=gen)
    s = torch.rand(K, generator=gen) + 0.5
    b = torch.randn(N, generator=gen)
    return w.to(device), x.to(device), s.to(device), b.to(device)
