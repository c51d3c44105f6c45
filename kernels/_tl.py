"""Triton helpers shared by the kernels."""
import os

import triton
import triton.language as tl

# The Triton interpreter (TRITON_INTERPRET=1, the CPU tests) needs a few numerics spelled out (see the users).
_INTERP = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _round_bf16(v):
    # fp32 -> fp32 holding the round-to-nearest-even bf16 value. Used only under TRITON_INTERPRET,
    # whose fp32 -> bf16 cast truncates (the GPU cast rounds to nearest even).
    bits = v.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _store_carry(ptr, S, mask, ROUND: tl.constexpr, CARRY_CAST: tl.constexpr):
    """Store the fp32 state tile S in ptr's dtype and return the value the next step starts from: the stored
    one (= eager decode steps back to back). ROUND (interpreter, bf16): round in fp32 first, as the GPU cast
    does; CARRY_CAST: the state dtype is not fp32, so the stored value differs from S."""
    if ROUND:
        Sq = _round_bf16(S)
        tl.store(ptr, Sq.to(ptr.dtype.element_ty), mask=mask)
        S = Sq
    else:
        Sq = S.to(ptr.dtype.element_ty)
        tl.store(ptr, Sq, mask=mask)
        if CARRY_CAST:
            S = Sq.to(tl.float32)
    return S


@triton.jit
def _softplus(v):
    # log1p(exp(v)) with an accurate log1p (Goldberg); identity above 20 like torch's softplus.
    u = tl.exp(v)
    w = 1.0 + u
    lp = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    return tl.where(v > 20.0, v, lp)


@triton.jit
def _slot_of(sid_ptr, row):
    # (slot, valid) of a batch row: a negative id is a padding row, clamped to slot 0 so its addresses
    # stay in bounds while every cache access of the row is masked off by `valid`.
    slot = tl.load(sid_ptr + row).to(tl.int64)
    valid = slot >= 0
    slot = tl.maximum(slot, 0)
    return slot, valid


@triton.jit
def _head_tile(D: tl.constexpr, BD: tl.constexpr, HPG: tl.constexpr):
    # grid (heads * cdiv(D, BD), batch): (row, head, D-tile, group / key head) of this program.
    NUM_T: tl.constexpr = (D + BD - 1) // BD
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    h = pid // NUM_T
    t = pid % NUM_T
    return row, h, t, h // HPG


@triton.jit
def _limit_masks(tile, valid, D: tl.constexpr, BD: tl.constexpr, E: tl.constexpr, BE: tl.constexpr,
                 L: tl.constexpr, LP: tl.constexpr):
    # offsets and masks of a replay program from scalar limits (0 on a padding row: it reads and writes
    # no cache): its D-tile rows, the state's E axis, the L ring entries (independent of the cursor).
    offs_d = tile * BD + tl.arange(0, BD)
    offs_e = tl.arange(0, BE)
    offs_l = tl.arange(0, LP)
    dm = offs_d < tl.where(valid, D, 0)
    em = offs_e < E
    rl = offs_l < tl.where(valid, L, 0)
    return offs_d, offs_e, offs_l, dm, em, rl


@triton.jit
def _tile_mask(rm, em, E: tl.constexpr, BE: tl.constexpr):
    # [rows, BE] mask: the E axis is masked only when E is not a power of two, so tile loads vectorise.
    if BE == E:
        m = rm[:, None]
    else:
        m = rm[:, None] & em[None, :]
    return m


@triton.jit
def _ring_mask(rl, dm, D: tl.constexpr, BD: tl.constexpr):
    # [LP, BD] mask of a ring (or window) tile: row mask only when BD divides D, so its loads vectorise.
    if D % BD == 0:
        m = rl[:, None]
    else:
        m = rl[:, None] & dm[None, :]
    return m


@triton.jit
def _round_e4m3(v):
    # fp32 -> fp32 holding the round-to-nearest-even float8_e4m3fn value (|v| <= 448). Used only
    # under TRITON_INTERPRET, whose fp8 cast carries a rounded-up mantissa into the wrong exponent
    # bit (halving e.g. 1.97 -> 1.0); a pre-rounded value converts exactly.
    bits = v.to(tl.uint32, bitcast=True)
    neg = (bits >> 31) != 0
    bits = bits + (0x7FFFF + ((bits >> 20) & 1))
    normal = ((bits >> 20) << 20).to(tl.float32, bitcast=True)
    a = tl.abs(v)
    sub = (a + 24576.0) - 24576.0  # subnormals (|v| < 2^-6): multiples of 2^-9, ties to even
    sub = tl.where(neg, -sub, sub)
    return tl.where(a < 0.015625, sub, normal)


@triton.jit
def _store_tile(ptr, sc_ptr, off, S, offs_p, pm, mask, IS_FP8: tl.constexpr, ROUND: tl.constexpr):
    """fp32 tile -> state copy; fp8: per-row scale amax/448 (1 for a zero row), like replay_common.store_state.
    ROUND (interpreter only): round in fp32 first, as the GPU's casts do (RTNE)."""
    if IS_FP8:
        sc = tl.max(tl.abs(S), axis=1) / 448.0
        sc = tl.where(sc > 0.0, sc, 1.0)
        q = tl.minimum(tl.maximum(S / sc[:, None], -448.0), 448.0)
        if ROUND:
            q = _round_e4m3(q)
        tl.store(ptr + off, q.to(ptr.dtype.element_ty), mask=mask)
        tl.store(sc_ptr + offs_p, sc, mask=pm)
    else:
        if ROUND:
            S = _round_bf16(S)
        tl.store(ptr + off, S.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fold_bf16x3(acc, a, b):
    """acc + a @ b for a bf16-valued b (a bf16 ring): a [BP, LP] fp32 split into three bf16 parts (hi + mid + lo
    hold its 24 bits, so each product is the fp32 one) on bf16 tensor cores, accumulated in fp32 into acc.
    Why not tf32x3: it also splits b (exact in bf16 already) and adds the dot result to S in another layout;
    with acc = the decayed checkpoint the tile stays in the MMA layout. The Triton interpreter's bf16 dot is
    wrong (3.9): there the parts go through an fp32 dot (the same products)."""
    a1 = a.to(tl.bfloat16)
    r = a - a1.to(tl.float32)
    a2 = r.to(tl.bfloat16)
    a3 = (r - a2.to(tl.float32)).to(tl.bfloat16)
    if _INTERP:
        bf = b.to(tl.bfloat16).to(tl.float32)
        acc = tl.dot(a1.to(tl.float32), bf, acc, input_precision="ieee")
        acc = tl.dot(a2.to(tl.float32), bf, acc, input_precision="ieee")
        acc = tl.dot(a3.to(tl.float32), bf, acc, input_precision="ieee")
    else:
        bb = b.to(tl.bfloat16)
        acc = tl.dot(a1, bb, acc)
        acc = tl.dot(a2, bb, acc)
        acc = tl.dot(a3, bb, acc)
    return acc


@triton.jit
def _serial_fold(S, a_ptrs, b_ptrs, d_ptr, a_step, b_step, n, coef, am, bm, L, SCALE_BY_D: tl.constexpr):
    """The eager recurrence over ring entries j < n, in order, on an fp32 register tile:
    Mamba-2 (SCALE_BY_D): S <- e^{coef d_j} S + (d_j a_j) b_j^T ; GDN: S <- e^{d_j} S + a_j b_j^T.
    Register-light (no dot operands), next entry prefetched; used by every flush."""
    aj = tl.load(a_ptrs, mask=am, other=0.0).to(tl.float32)
    bj = tl.load(b_ptrs, mask=bm, other=0.0).to(tl.float32)
    dj = tl.load(d_ptr)
    for j in range(0, n):
        jn = tl.minimum(j + 1, L - 1)  # in-bounds prefetch; unused after the last entry
        an = tl.load(a_ptrs + jn * a_step, mask=am, other=0.0).to(tl.float32)
        bn = tl.load(b_ptrs + jn * b_step, mask=bm, other=0.0).to(tl.float32)
        dn = tl.load(d_ptr + jn)
        if SCALE_BY_D:
            S = tl.exp(coef * dj) * S + (dj * aj)[:, None] * bj[None, :]
        else:
            S = tl.exp(dj) * S + aj[:, None] * bj[None, :]
        aj = an
        bj = bn
        dj = dn
    return S


@triton.jit
def _store_state(ptr, sc_ptr, off, S, offs_p, pm, mask, IS_FP8: tl.constexpr):
    if IS_FP8:
        amax = tl.max(tl.abs(S), axis=1)
        sc = amax / 448.0
        sc = tl.where(sc > 0.0, sc, 1.0)
        q = tl.minimum(tl.maximum(S / sc[:, None], -448.0), 448.0)
        tl.store(ptr + off, q.to(ptr.dtype.element_ty), mask=mask)
        tl.store(sc_ptr + offs_p, sc, mask=pm)
    else:
        tl.store(ptr + off, S.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_tile(hc, pb, valid, HPP: tl.constexpr, REP: tl.constexpr, P: tl.constexpr, BP: tl.constexpr,
                N: tl.constexpr, BN: tl.constexpr, LP: tl.constexpr):
    """A head-group replay program's tile: (h0, group, offs_p, pm, offs_n, nm, offs_l) for its first head
    h0 = hc * HPP (REP heads per group), rows pb * BP + [0, BP) of P, columns [0, BN) of N and ring positions
    [0, LP). Masks come from scalar limits (0 on a skipped row): the Triton interpreter turns `vector &
    scalar-bool` into int32."""
    h0 = hc * HPP
    grp = h0 // REP
    offs_p = pb * BP + tl.arange(0, BP)
    pm = offs_p < tl.where(valid, P, 0)
    offs_n = tl.arange(0, BN)
    nm = offs_n < tl.where(valid, N, 0)
    return h0, grp, offs_p, pm, offs_n, nm, tl.arange(0, LP)


@triton.jit
def _window_cursor(wp_ptr, slot64, valid, L: tl.constexpr, min_room, MODE: tl.constexpr, ADVANCE: tl.constexpr,
                   NPROG: tl.constexpr, TICKET: tl.constexpr):
    """The head-group replay kernels' cursor: (wp, flush) of the row's slot. Flush mode (MODE 2) fires where
    wp > 0 and wp + min_room > L; only a firing flush moves the cursor: every program of the slot decides
    alike, takes a ticket in write_pos's high bits, and the last one resets it (a flush check that does not
    fire is one load per program, no atomics). Other modes never flush and never move the cursor."""
    wp = tl.load(wp_ptr + slot64, mask=valid, other=0)
    if MODE == 2:
        wp = wp & (TICKET - 1)  # other programs of the slot may have added their tickets already
        flush = (wp > 0) & (wp + min_room > L) & valid
        if ADVANCE:  # (the launcher clears ADVANCE for verify)
            if flush:
                old = tl.atomic_add(wp_ptr + slot64, TICKET)
                tl.atomic_xchg(wp_ptr + slot64, 0, mask=(old // TICKET) == NPROG - 1)
    else:
        flush = wp < 0  # never
    return wp, flush


@triton.jit
def _decode_cursor(wp_ptr, slot64, valid, L: tl.constexpr, ADVANCE: tl.constexpr, NPROG: tl.constexpr,
                   TICKET: tl.constexpr):
    """The head-group decode kernels' cursor: (wp, flush, n_w) of the row's slot. ADVANCE: a relaxed atomic ticket
    in write_pos's high bits (RMWs on one address are totally ordered, so the last arrival's exchange follows every
    read) moves it to 0 after a flush, else to wp + 1. n_w: ring entries this step caches (a flush caches none)."""
    if ADVANCE:
        old = tl.atomic_add(wp_ptr + slot64, TICKET, mask=valid, sem="relaxed")
        old = tl.where(valid, old, 0)
        wp = old & (TICKET - 1)
        last = ((old // TICKET) == NPROG - 1) & valid
    else:
        wp = tl.load(wp_ptr + slot64, mask=valid, other=0)
    flush = wp >= L - 1
    if ADVANCE:
        tl.atomic_xchg(wp_ptr + slot64, tl.where(flush, 0, wp + 1), mask=last, sem="relaxed")
    n_w = tl.where(valid & (wp < L - 1), 1, 0)
    return wp, flush, n_w


@triton.jit
def _load_state(ptr, sc_ptr, st_off, tile_mask, sc_off, sc_mask, FP8: tl.constexpr):
    """A state tile as fp32: ptr[st_off] (checkpoint or its low-precision copy), times its per-row scale
    sc_ptr[sc_off] when stored as fp8."""
    S = tl.load(ptr + st_off, mask=tile_mask, other=0.0).to(tl.float32)
    if FP8:
        S = S * tl.load(sc_ptr + sc_off, mask=sc_mask, other=0.0)[:, None]
    return S
