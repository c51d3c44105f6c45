"""Triton helpers shared by the kernels."""
import triton
import triton.language as tl


@triton.jit
def _round_bf16(v):
    # fp32 -> fp32 holding the round-to-nearest-even bf16 value. Used only under TRITON_INTERPRET,
    # whose fp32 -> bf16 cast truncates (the GPU cast rounds to nearest even).
    bits = v.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


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
