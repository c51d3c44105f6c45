"""Helpers shared by the ReplaySSM kernels (Mamba-2 and GDN): cursor moves, fp8 checkpoints, the per-head decode
launchers' defaults and their split-step dispatch (`run_split`).

Cursor contract (per slot, per SSM layer; ``write_pos`` is int32 ``[slots]`` on the state device):
``write_pos[s]`` = number of committed tokens cached in the ring since the checkpoint, 0 ≤ wp ≤ L.
All functions here are pure device work (no host sync), so they can sit inside a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_DTYPES = (torch.float8_e4m3fn,)
WP_TICKET = 1 << 16  # kernels count arrivals in write_pos's high bits while they update it


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def is_fp8(t: torch.Tensor | None) -> bool:
    return t is not None and t.dtype in FP8_DTYPES


def quantize_rows_fp8(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``[..., R, C]`` -> (fp8 e4m3 ``[..., R, C]``, fp32 scale ``[..., R]``), one scale per row.

    The scale tile is one row of the state (Mamba-2: one (head, p) row over N; GDN: one (head, v)
    row over K): scale = amax(|row|) / 448 (1 for an all-zero row), q = round_rtne(row / scale).
    """
    s = s.float()
    scale = s.abs().amax(-1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (s / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A checkpoint in any supported dtype -> fp32 (per-row scale when fp8)."""
    if is_fp8(t):
        if scale is None:
            raise ValueError("an fp8 checkpoint needs its per-row fp32 scale tensor")
        return t.float() * scale.float()[..., None]
    return t.float()


def store_state(dst: torch.Tensor, dst_scale: torch.Tensor | None, s: torch.Tensor) -> None:
    """Write fp32 state ``s`` into ``dst`` (fp32 / bf16 / fp16 copy, or fp8 with per-row scales)."""
    if is_fp8(dst):
        q, sc = quantize_rows_fp8(s)
        dst.copy_(q)
        dst_scale.copy_(sc)
    else:
        dst.copy_(s.to(dst.dtype))


def verify_rows(slot_ids: torch.Tensor, write_pos: torch.Tensor, T: int, L: int):
    """The torch references' verify loop: (row, slot, write_pos) of each row with a slot (negative ids skip),
    checking the window fits the ring."""
    for i in range(slot_ids.shape[0]):
        s = int(slot_ids[i])
        if s < 0:
            continue
        wp = int(write_pos[s])
        assert wp + T <= L, "verify needs write_pos + T <= L (flush first)"
        yield i, s, wp


def flush_slots(slot_ids: torch.Tensor, write_pos: torch.Tensor, L: int, min_room: int | None):
    """The torch references' flush loop: (slot, write_pos) of each row's slot where the flush rule fires
    (wp > 0 and, unless min_room is None, wp + min_room > L)."""
    for s in slot_ids.tolist():
        if s < 0:
            continue
        wp = int(write_pos[s])
        if wp == 0 or wp + (L + 1 if min_room is None else min_room) <= L:
            continue
        yield s, wp


def check_ring(want: dict, write_pos: torch.Tensor, L: int, decays: tuple[str, torch.Tensor]) -> None:
    """Ring tensors (name → (tensor, shape)) contiguous and shaped; an int32 cursor; fp32 decays."""
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape} (L={L})")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if write_pos.dtype != torch.int32:
        raise ValueError(f"write_pos: dtype {write_pos.dtype}, expected torch.int32")
    if decays[1].dtype != torch.float32:
        raise ValueError(f"{decays[0]} must be float32")


def check_state_pair(t: torch.Tensor | None, scale: torch.Tensor | None, name: str, state_shape) -> None:
    if t is None:
        return
    if tuple(t.shape) != tuple(state_shape):
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(state_shape)}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) + FP8_DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype}, expected float32/bfloat16/float16/float8_e4m3fn")
    if is_fp8(t):
        if scale is None or tuple(scale.shape) != tuple(state_shape[:-1]) or scale.dtype != torch.float32:
            raise ValueError(f"{name} is fp8: needs a float32 scale of shape {tuple(state_shape[:-1])}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def replay_commit(write_pos: torch.Tensor, accepted: torch.Tensor, slot_ids: torch.Tensor | None = None,
                  *, L: int | None = None) -> torch.Tensor:
    """After a verify: ``write_pos[slot_ids[i]] += accepted[i]`` (rows with a negative slot skip).

    ``accepted`` = window tokens kept (1..T, the first window token included), a device tensor; no
    host sync. The accepted tokens' ring entries were already written by the verify at
    write_pos..write_pos+T-1; the rejected ones are simply overwritten later. With ``slot_ids=None``
    ``accepted`` is indexed by slot. ``L`` (optional) clamps the cursor to L.
    """
    acc = accepted.to(device=write_pos.device, dtype=write_pos.dtype)
    if slot_ids is None:
        write_pos.add_(acc)
    else:
        sid = slot_ids.to(device=write_pos.device, dtype=torch.long)
        valid = sid >= 0
        write_pos.index_add_(0, sid.clamp(min=0), torch.where(valid, acc, torch.zeros_like(acc)))
    if L is not None:
        write_pos.clamp_(max=L)
    return write_pos


def replay_advance(write_pos: torch.Tensor, slot_ids: torch.Tensor, *, L: int) -> torch.Tensor:
    """Cursor move of one standard decode step, for callers that share one ``write_pos`` across
    layers and call the decode kernels with ``advance=False``: wp <- 0 if wp >= L-1 (the step
    flushed) else wp + 1. Negative slots skip."""
    sid = slot_ids.to(device=write_pos.device, dtype=torch.long)
    valid = sid >= 0
    idx = sid.clamp(min=0)
    wp = write_pos.index_select(0, idx)
    new = torch.where(wp >= L - 1, torch.zeros_like(wp), wp + 1)
    # index_add of a delta (0 on skipped rows), so a padded row aliasing slot 0 cannot clobber it
    write_pos.index_add_(0, idx, torch.where(valid, new - wp, torch.zeros_like(wp)))
    return write_pos


def replay_flush_reset(write_pos: torch.Tensor, slot_ids: torch.Tensor, *, L: int,
                       min_room: int | None = None) -> torch.Tensor:
    """Cursor move of a flush, for callers that flush with ``advance=False``: wp <- 0 where the
    flush rule fired (wp > 0 and, unless min_room is None, wp + min_room > L)."""
    sid = slot_ids.to(device=write_pos.device, dtype=torch.long)
    valid = sid >= 0
    idx = sid.clamp(min=0)
    wp = write_pos.index_select(0, idx)
    room = L + 1 if min_room is None else min_room
    fire = valid & (wp > 0) & (wp + room > L)
    write_pos.index_add_(0, idx, torch.where(fire, -wp, torch.zeros_like(wp)))
    return write_pos


def split_default(ckpt_lo, rows: int) -> bool:
    """Two launches (output-only rows, then flushing rows) instead of one fused kernel, for a low-precision
    checkpoint copy at rows = batch x heads >= 8192: the fused kernel's registers are set by its rarely taken flush
    branch, so the common step runs at low occupancy; fp32 gains nothing. See docs/tuning/replay.md."""
    return ckpt_lo is not None and rows >= 8192


def ring_by_cursor_default(split: bool) -> bool:
    """Whether a decode launch reads only the ring entries below the cursor (a plain step then moves on average
    half the ring bytes) instead of all L with no cursor dependency. Shared by the Mamba-2 and GDN decode kernels.
    On for a split step's output-only launch only: in a fused step the cursor load delays the ring loads
    (docs/tuning/replay.md)."""
    return split


def ring_dots_default(split: bool) -> bool:
    """Whether a decode step first runs the verify path's prologue at T = 1 (GDN: the normalised k and q, k . q
    and the ring's k_j . k, k_j . q once per (row, key head); Mamba-2: B_j . C_t and B_t . C_t once per (row,
    group)) so the main kernel reads no [L, K] key / [L, N] B ring. Shared by the Mamba-2 and GDN decode kernels.
    It cuts the main kernel's registers; on for a split step's output-only launch, off for a fused step, where the
    extra launch costs more than it saves (docs/tuning/replay.md)."""
    return split


def overlap_default(split: bool) -> bool:
    """Whether a split step's flush launch runs on a side stream beside the output-only launch (their rows are
    disjoint) instead of after it. In order, the flush launch's few long programs (1/L of the rows when cursors
    are staggered, as in serving) leave most SMs idle at its end; beside the output-only launch they fill its gaps.
    On wherever a step is split; fp32 steps stay fused (docs/tuning/replay.md)."""
    return split


_FLUSH_STREAMS: dict[int, torch.cuda.Stream] = {}


def flush_stream(device: torch.device) -> torch.cuda.Stream:
    """One high-priority side stream per CUDA device for the flush launches of split steps: its few long programs
    are dispatched first and the output-only launch fills the SMs around them. Reused across calls, so a captured
    CUDA graph forks to and joins from the same stream every step."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx not in _FLUSH_STREAMS:
        _FLUSH_STREAMS[idx] = torch.cuda.Stream(device=idx, priority=-1)
    return _FLUSH_STREAMS[idx]


def run_split(device: torch.device, output_only, flush, overlap: bool) -> None:
    """The two launches of a split step. overlap (CUDA): flush on `flush_stream(device)` after all work queued so
    far, output_only on the current stream, then the current stream waits for both (a CUDA graph capture records a
    fork and a join); else output_only, then flush, in order."""
    if not (overlap and torch.device(device).type == "cuda"):
        output_only()
        flush()
        return
    cur = torch.cuda.current_stream(device)
    side = flush_stream(device)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        flush()
    output_only()
    cur.wait_stream(side)



@dataclass(frozen=True)
class LaunchPlan:
    """The tuning knobs of a replay kernel entry (decode, verify, flush), in one object; None / "auto" = the
    measured default for the call (the rules and their measurements: docs/tuning/replay.md).

    impl: "per_head" (one head per program, the eager kernels' shape; the cursor is only read) |
        "head_group" (several heads per program; moves the cursor itself) | "auto".
    config: the chosen kernel's launch config (per-head decode: (BLOCK, num_warps[, fold[, maxnreg]]); per-head
        verify: (BLOCK, num_warps[, gram[, maxnreg[, dot]]]); head-group: (BLOCK, heads per program, num_warps[,
        maxnreg])).
    split (per-head decode): an output-only launch plus a flush launch (True) or one fused launch (False).
    flush_config (split): the flush launch's (BLOCK, num_warps[, fold[, tiles per program]]).
    ring_by_cursor (per-head decode): read only the ring entries below the cursor.
    ring_dots (per-head decode, split): the ring's dot products from the verify path's prologue at T = 1.
    overlap (split): the flush launch on a side stream beside the output-only launch."""
    impl: str = "auto"
    config: tuple | None = None
    split: bool | None = None
    flush_config: tuple | None = None
    ring_by_cursor: bool | None = None
    ring_dots: bool | None = None
    overlap: bool | None = None


# -- launch plans shared by the Mamba-2 and GDN per-head kernels ------------------------------------
FOLDS = {"serial": 0, "dot": 1, "tf32x3": 2, "bf16x3": 3}


def decode_config(config, block_warps: tuple[int, int], fold_for) -> tuple[int, int, str, int | None]:
    """A per-head decode launch config (BLOCK, num_warps[, fold[, maxnreg]]) over the defaults (shared with the GDN
    kernel): block_warps when config is empty, fold_for(BLOCK, num_warps) when it names no fold."""
    c = tuple(config or ())
    if c and not 2 <= len(c) <= 4:
        raise ValueError(f"config: expected (BLOCK, num_warps[, fold[, maxnreg]]), got {config!r}")
    block, nw = c[:2] if c else block_warps
    fold = c[2] if len(c) > 2 else fold_for(block, nw)
    if fold not in FOLDS:
        raise ValueError(f"config: fold {fold!r}, expected one of {sorted(FOLDS)}")
    return block, nw, fold, (c[3] if len(c) > 3 else None)


def resolve_flush_config(config, block: int, warps: int, fold: str, tpp: int = 16) -> tuple[int, int, str, int]:
    """(BLOCK, num_warps, fold, tiles per program) of the flush launch of a split step (shared with the GDN
    kernel): config over (block, warps, fold, tpp)."""
    c = tuple(config or ())
    if c and not 2 <= len(c) <= 4:
        raise ValueError(f"flush_config: expected (BLOCK, num_warps[, fold[, tiles per program]]), got {config!r}")
    out = c + (block, warps, fold, tpp)[len(c):]
    if out[2] not in FOLDS:
        raise ValueError(f"flush_config: fold {out[2]!r}, expected one of {sorted(FOLDS)}")
    if not (isinstance(out[3], int) and out[3] >= 1):
        raise ValueError(f"flush_config: tiles per program {out[3]!r}, expected an integer >= 1")
    return out


def parse_verify_config(config, default, block_name):
    """config = (BLOCK, num_warps[, gram[, maxnreg[, dot]]]); missing entries from the default."""
    cfg = tuple(config)
    if not 2 <= len(cfg) <= 5:
        raise ValueError(f"config: impl='per_head' takes ({block_name}, num_warps[, gram[, maxnreg[, dot]]]), "
                         f"got {cfg!r}")
    if len(cfg) > 2 and not isinstance(cfg[2], bool):  # e.g. a head-group config (BLOCK, heads, warps, maxnreg)
        raise ValueError(f"config: impl='per_head' takes ({block_name}, num_warps[, gram[, maxnreg]]) with gram a "
                         f"bool, "
                         f"got {cfg!r}")
    block, nw = int(cfg[0]), int(cfg[1])
    gram = cfg[2] if len(cfg) > 2 else default[2]
    maxnreg = cfg[3] if len(cfg) > 3 else None
    dot = bool(cfg[4]) if len(cfg) > 4 else False
    return block, nw, gram, maxnreg, dot
