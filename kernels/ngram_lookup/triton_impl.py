"""Triton kernel of `ngram_hints`: one program per row; the anchor is stored, then blocks of candidate ends
j < p are scored by their match length with the suffix (max_ngram unrolled loads each) and the best
(length, then latest j) is kept as one packed integer, length * (T + 1) + j."""
import triton
import triton.language as tl


@triton.jit
def _ngram_hints_kernel(hist_ptr, rows_ptr, anchors_ptr, pos_ptr, out_ptr, T, stride_h, GAMMA,
                        MAXN: tl.constexpr, MINN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows_ptr + b)
    p = tl.minimum(tl.load(pos_ptr + b), T - 1)
    base = hist_ptr + row * stride_h
    tl.store(base + p, tl.load(anchors_ptr + b))
    tl.debug_barrier()  # the suffix below includes the anchor just stored
    best = tl.full((), -1, tl.int64)
    for start in range(0, p, BLOCK_T):
        j = start + tl.arange(0, BLOCK_T)
        alive = j < p
        m = tl.zeros((BLOCK_T,), tl.int64)
        for i in tl.static_range(MAXN):
            ok = alive & (j >= i)  # (then p > j >= i: the suffix token p - i exists too)
            tj = tl.load(base + j - i, mask=ok, other=0)
            si = tl.load(base + tl.maximum(p - i, 0))
            alive = ok & (tj == si)
            m += alive.to(tl.int64)
        m = tl.minimum(m, p)  # a suffix of n tokens needs n <= p (it must start after position 0)
        key = tl.where(m >= MINN, m * (T + 1) + j, -1)
        best = tl.maximum(best, tl.max(key, 0))
    jb = tl.where(best >= 0, best % (T + 1), -1)
    k = tl.arange(0, BLOCK_G)
    src = jb + 1 + k
    ok = (k < GAMMA) & (src <= p) & (src > k)  # (src > k: a hit, jb >= 0, written on the block)
    tok = tl.load(base + src, mask=ok, other=-1)
    tl.store(out_ptr + b * GAMMA + k, tl.where(ok, tok, -1), mask=k < GAMMA)


def ngram_hints_triton(history, rows, anchors, positions, gamma: int, max_ngram: int, min_ngram: int = 1):
    import torch
    B, T = rows.shape[0], history.shape[1]
    out = torch.empty(B, gamma, dtype=torch.long, device=history.device)
    if B == 0:
        return out
    _ngram_hints_kernel[(B,)](history, rows, anchors, positions, out, T, history.stride(0), gamma,
                              MAXN=max_ngram, MINN=min_ngram, BLOCK_T=256, BLOCK_G=triton.next_power_of_2(gamma),
                              num_warps=4)
    return out
