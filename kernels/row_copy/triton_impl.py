"""Triton kernel of `copy_rows`: one program per (block of rows, block of columns), row-wide vector
loads and stores. Either side may be pinned host memory on a GPU run (read/written through unified
addressing), so the write-through backup and host → device promotions need no staging copy."""
import triton
import triton.language as tl


@triton.jit
def _copy_rows_kernel(dst_ptr, dst_rows_ptr, src_ptr, src_rows_ptr, M, W,
                      BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ow = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mm = om < M
    d = tl.load(dst_rows_ptr + om, mask=mm, other=0).to(tl.int64)
    s = tl.load(src_rows_ptr + om, mask=mm, other=0).to(tl.int64)
    mask = mm[:, None] & (ow < W)[None, :]
    x = tl.load(src_ptr + s[:, None] * W + ow[None, :], mask=mask)
    tl.store(dst_ptr + d[:, None] * W + ow[None, :], x, mask=mask)


def copy_rows_triton(dst, dst_rows, src, src_rows, block_m: int = 8, num_warps: int = 4) -> None:
    M, W = dst_rows.shape[0], dst.shape[-1]
    if M == 0:
        return
    block_w = min(1024, triton.next_power_of_2(W))
    _copy_rows_kernel[(triton.cdiv(M, block_m), triton.cdiv(W, block_w))](
        dst, dst_rows, src, src_rows, M, W, BLOCK_M=block_m, BLOCK_W=block_w, num_warps=num_warps)
