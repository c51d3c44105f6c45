"""Triton kernel of `fetch_rows` (kernels/kv_resolve/fetch.py): one program per (block of entries, block of
columns); lanes of entries with a negative source row are masked, so they read and write nothing."""
import triton
import triton.language as tl


@triton.jit
def fetch_rows_kernel(dst_ptr, dst_rows_ptr, src_ptr, src_rows_ptr, M, W,
                      BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ow = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mm = om < M
    s = tl.load(src_rows_ptr + om, mask=mm, other=-1).to(tl.int64)
    live = mm & (s >= 0)
    d = tl.load(dst_rows_ptr + om, mask=live, other=0).to(tl.int64)
    mask = live[:, None] & (ow < W)[None, :]
    x = tl.load(src_ptr + s[:, None] * W + ow[None, :], mask=mask)
    tl.store(dst_ptr + d[:, None] * W + ow[None, :], x, mask=mask)
