"""Registers and spills of the ReplaySSM per-head decode kernels per route, compiled offline for sm_90 (no GPU needed:
Triton's compiler and the `cuobjdump` it ships). The figures behind `split_default` in
`mamba2_replay.decode` and `gdn_replay.decode`.

    python -m benchmarks.reg_usage                  # the shapes of bench_replay, every route

Pointer arguments are compiled as 16-byte aligned, as Triton specialises them at launch (without that hint
the loads compile to scalar accesses and the counts mean nothing). The device's Triton version may allocate
differently; the counts are a guide to which branch sets the budget, not a substitute for timing.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

# (kernel, pointer dtypes (dual / fp32 checkpoint), constexprs, (tile, warps, fold) of the bench_replay defaults)
M2_PTRS = dict(ck_ptr="*fp32", cks_ptr="*fp32", los_ptr="*fp32", rx_ptr="*bf16", rdt_ptr="*fp32", rB_ptr="*bf16",
               wp_ptr="*i32", x_ptr="*bf16", dt_ptr="*bf16", A_ptr="*fp32", B_ptr="*bf16", C_ptr="*bf16",
               D_ptr="*fp32", bias_ptr="*fp32", z_ptr="*bf16", y_ptr="*bf16", sid_ptr="*i32", rwp_ptr="*i32",
               bc_ptr="*fp32")
GDN_PTRS = dict(ck_ptr="*fp32", cks_ptr="*fp32", los_ptr="*fp32", ru_ptr="*bf16", rk_ptr="*bf16", rg_ptr="*fp32",
                wp_ptr="*i32", q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", g_ptr="*fp32", beta_ptr="*fp32",
                o_ptr="*bf16", sid_ptr="*i32", kq_ptr="*fp32")


def compile_usage(fn, ptrs: dict, constexprs: dict, num_warps: int) -> dict:
    """{'regs', 'spill_bytes'} of fn compiled for sm_90 with every pointer 16-byte aligned; constexpr parameters
    not in constexprs take their defaults (as a launch that omits them: left out, they would compile as i32)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    defaults = {p.name: p.default for p in inspect.signature(fn.fn).parameters.values()
                if p.default is not inspect.Parameter.empty}
    constexprs = {**{p.name: defaults[p.name] for p in fn.params if p.is_constexpr and p.name in defaults},
                  **constexprs}

    sig = {a: ptrs.get(a) or ("constexpr" if a in constexprs else "fp32" if a == "scale" else "i32")
           for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    return {"regs": int(regs.group(1)) if regs else -1, "spill_bytes": int(stack.group(1)) if stack else 0}


def rows() -> list[dict]:
    from synodic.kernels.gdn_replay.decode import _gdn_replay_decode_kernel as gdn
    from synodic.kernels.mamba2_replay.decode import FOLDS
    from synodic.kernels.mamba2_replay.decode import _mamba2_replay_decode_kernel as m2

    out = []
    for lo in ("bf16", None):
        flags = dict(HAS_LO=lo is not None, CK_FP8=False, LO_FP8=False, ROUND_CK=False, ROUND_LO=False,
                     ROUND_OUT=False)
        m2_fold, gdn_fold = ("tf32x3", "dot") if lo else ("serial", "serial")
        for route, warps, tpp in ((0, 2, 1), (1, 2, 1), (2, 4, 16)):
            c = dict(H=128, G=8, P=64, N=128, L=16, LP=16, BP=64, BN=128, HAS_Z=True, FOLD=FOLDS[m2_fold],
                     ROUTE=route, TPP=tpp, **flags)
            u = compile_usage(m2, dict(M2_PTRS, lo_ptr="*bf16" if lo else "*fp32"), c, warps)
            out.append(dict(kernel="mamba2", checkpoint=f"dual_{lo}" if lo else "fp32", route=route,
                            tile=64, warps=warps, fold=m2_fold, **u))
        for route, warps, tpp, dots in ((0, 1, 1, False), (0, 1, 1, True), (1, 1, 1, False), (1, 1, 1, True),
                                        (2, 1, 16, False)):
            c = dict(HV=32, Hk=16, V=128, K=128, L=16, LP=16, BV=32, BK=128, USE_L2=True, ROUND_RU=False,
                     ROUND_RK=False, FOLD=FOLDS[gdn_fold], ROUTE=route, TPP=tpp, DOTS=dots, RW=2 * 128 + 2 * 16 + 8,
                     **flags)
            u = compile_usage(gdn, dict(GDN_PTRS, lo_ptr="*bf16" if lo else "*fp32"), c, warps)
            out.append(dict(kernel="gdn" + (" (ring_dots)" if dots else ""), checkpoint=f"dual_{lo}" if lo else "fp32",
                            route=route, tile=32, warps=warps, fold=gdn_fold, **u))
    return out


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    res = rows()
    names = {0: "fused", 1: "output-only", 2: "flush"}
    print("| kernel | checkpoint | launch | tile, warps, fold | registers | spill bytes |")
    print("|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['kernel']} | {r['checkpoint']} | {names[r['route']]} | {r['tile']}, {r['warps']}, {r['fold']} "
              f"| {r['regs']} | {r['spill_bytes']} |")
    return res


if __name__ == "__main__":
    main()
