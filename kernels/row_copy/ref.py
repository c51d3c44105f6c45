"""Torch reference of `copy_rows`: dst[dst_rows[m]] = src[src_rows[m]]."""
import torch


def copy_rows_ref(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor, src_rows: torch.Tensor) -> None:
    vals = src[src_rows.to(src.device).long()]
    dst[dst_rows.to(dst.device).long()] = vals.to(dst.device)
