"""Helpers shared by the ReplaySSM kernels (Mamba-2 and GDN): cursor moves, fp8 checkpoints, the per-head decode
launchers' defaults and their split-step dispatch (`run_split`).

Cursor contract (per slot, per SSM layer; ``write_pos`` is int32 ``[slots]`` on the state device):
``write_pos[s]`` = number of committed tokens cached in the ring since the checkpoint, 0 ≤ wp ≤ L.
All functions here are pure device work (no host sync), so they can sit inside a CUDA graph.
"""
from __future__ import annotations

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
    """Two launches (output-only rows, then flushing rows) instead of one fused kernel: the fused kernel's
    register budget is set by its rarely taken flush branch (dual bf16 [64, N] on 2 warps: 255 registers and
    spills, the output-only path alone 168; `python -m benchmarks.reg_usage`, Triton 3.9), so the common
    step runs at low occupancy. H200, batch 256, bench_replay_flush 2026-11-30 07:50 UTC, do_bench plain / flush step:
    dual_bf16 fused (64, 2, tf32x3) 234 / 1120 µs, split 174 / 1134 µs (flush launch (64, 4 warps, tf32x3,
    16 tiles per program)); cycle 1.84x -> 2.27x eager (graph-timed bench_replay: 2.41x). A cursor-first
    output-only launch trades 8 µs per plain step for 135 µs per flush step: equal over a cycle, so off.
    fp32 gains nothing (240 vs 252 registers: the fp32 tile itself is the budget) and pays the flush launch
    (plain 292 -> 319 µs). At batch 8 (1024 rows) the second launch made the step slower (15.5 vs 14.0 µs).
    With the flush launch beside the output-only one (`overlap_default`), dual bf16 with the engine's per-row
    cursors, 24 slot sets, staggered / aligned cursors, µs fused -> split (H200, 2026-12-01 10:16 UTC): batch 16
    29.8 -> 38.7 / 29.4 -> 27.0; batch 32 41.7 -> 47.2 / 40.8 -> 33.8; batch 64 73.7 -> 59.2 / 71.4 -> 57.3;
    batch 128 137.3 -> 101.8 / 133.0 -> 103.8. Serving staggers the cursors, so: a low-precision copy at
    rows = batch x heads >= 8192 (batch 64 at 128 heads; was 4096). In the model, nemotron_h_8b dual bf16 decode at
    batch 32 (staggered): 5.991 / 5.991 ms split -> 5.754 / 5.763 ms fused (10:21 UTC)."""
    return ckpt_lo is not None and rows >= 8192


def ring_by_cursor_default(split: bool) -> bool:
    """Whether a per-head decode launch reads only the ring entries below the cursor (a plain step then moves wp
    entries,
    on average half the ring bytes) instead of all L with no cursor dependency. Shared by the Mamba-2 and GDN per-head
    decode kernels. H200, bench_replay --ring-sweep, full L = 16 cycles in CUDA graphs, batch 256 (2026-11-30 10:33
    and 10:45 UTC): the split dual step's output-only launch, Mamba-2 208.0 / 209.2 -> 200.2 / 201.4 µs, GDN 146.1
    -> 136.9 µs; the fused fp32 step, whose cursor load then sits between the slot id and the ring loads, Mamba-2
    291.7 / 294.3 -> 318.4 / 318.6 µs, GDN 173.2 -> 194.8 µs (with the cursor gathered per row before the step,
    loaded beside the slot id, Mamba-2 fp32 still 298.9 -> 312.1 µs); fused at batch 1-32: equal or slower. So on
    for the output-only launch of a split step only."""
    return split


def ring_dots_default(split: bool) -> bool:
    """Whether a per-head decode step first runs the verify path's prologue at T = 1 (GDN: the normalised k and q, k . q
    and the ring's k_j . k, k_j . q once per (row, key head); Mamba-2: B_j . C_t and B_t . C_t once per (row,
    group)) so the main kernel reads no [L, K] key / [L, N] B ring. Shared by the Mamba-2 and GDN per-head decode
    kernels.
    Registers (offline sm_90 compile): GDN (32, 1 warp) fused fp32 255 -> 221, output-only fp32 200 -> 145,
    output-only dual bf16 154 -> 96; Mamba-2 dual output-only ([64, N], 2 warps, the engine's cursor mode) 168 ->
    128. H200, 24 slot sets, off / on / off / on, µs per step (bench_replay --stagger --dots-sweep, 2026-12-01
    07:49, 07:53, 08:15 UTC), aligned cursors ; staggered:
      GDN split dual bf16, batch 256: 137.3 / 131.4 / 137.5 / 131.5 ; 156.6 / 147.5 / 156.3 / 148.0
                           batch 128: 73.1 / 72.5 / 73.1 / 72.4 ; 92.3 / 89.8 / 92.5 / 89.9;  batch 32: 23.8 -> 23.6
      GDN fused fp32,      batch 256: 179.3 / 185.1 / 186.5 / 185.0 ; 189.2 / 187.2 / 189.0 / 187.4
                           batch 128: 91.6 / 96.9 / 91.5 / 96.8 ; 94.7 / 99.5 / 94.7 / 99.6;  batch 32: 30.0 -> 33.6
      GDN fp32 as two launches with the prologue, batch 256: 190.7 ; 217.6 (slower than fused)
      Mamba-2 split dual bf16, batch 256: per-row cursors (the engine's) 215.0 / 201.4 / 214.9 / 201.4; cursor read
                           in the kernel 205.2 / 204.3 / 206.1 / 204.3; staggered 224.9 / 225.3 / 224.9 / 225.1.
    In the model at batch 256 (staggered): qwen35_gdn_4b dual bf16 8.613 / 8.400 / 8.605 / 8.390 ms, fp32 9.335 /
    9.329 / 9.284 / 9.294 ms (07:54 UTC); nemotron_h_8b dual bf16 12.99 -> 12.81 and 12.95 -> 12.77 ms (08:16,
    08:17 UTC). So on for a split step's output-only launch, off for a fused step."""
    return split


def overlap_default(split: bool) -> bool:
    """Whether a split step's flush launch runs on a side stream beside the output-only launch (their rows are
    disjoint) instead of after it. In order, the flush launch's few long programs (1/L of the rows when cursors
    are staggered, as in serving) left most SMs idle at its end; beside the output-only launch they fill its gaps.
    H200, batch 256, 24 slot sets, the engine's cursor modes, µs per step in order -> overlapped (bench_replay
    cases, 2026-12-01 09:51-09:56 UTC): GDN dual bf16 staggered 148.6 -> 128.6, aligned 132.1 ->
    129.0; Mamba-2 dual bf16 (per-row cursors) staggered 220.8 -> 195.7, aligned 200.3 -> 195.8. The fp32 steps
    stay fused: as split steps, even overlapped, GDN took 185.6-192.7 µs against fused 177.3-181.9, Mamba-2
    300.7-344.5 against 305.5-309.7 (and a slower model step). So on wherever a step is split."""
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
