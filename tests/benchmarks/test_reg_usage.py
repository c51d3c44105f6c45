"""reg_usage: the replay decode kernels compile offline for sm_90, and the reason for the split decode step
holds: the dual-precision Mamba-2 kernel's output-only launch needs fewer registers than the fused one.
Compiled in a subprocess: the test session runs Triton's interpreter, which cannot compile."""
import json
import os
import subprocess
import sys

import pytest
import triton

TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
CODE = """
import json
from benchmarks import reg_usage
from synodic.kernels.mamba2_replay.decode import FOLDS, _mamba2_replay_decode_kernel as m2
ptrs = dict(reg_usage.M2_PTRS, lo_ptr="*bf16")
c = dict(H=128, G=8, P=64, N=128, L=16, LP=16, BP=64, BN=128, HAS_Z=True, FOLD=FOLDS["tf32x3"], TPP=1,
         HAS_LO=True, CK_FP8=False, LO_FP8=False, ROUND_CK=False, ROUND_LO=False, ROUND_OUT=False)
print(json.dumps([reg_usage.compile_usage(m2, ptrs, dict(c, ROUTE=r), 2) for r in (0, 1)]))
"""


@pytest.mark.skipif(not os.path.exists(TOOL), reason="Triton's NVIDIA backend tools are not installed")
def test_output_only_launch_needs_fewer_registers():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    fused, plain = json.loads(res.stdout.strip().splitlines()[-1])
    assert 0 < plain["regs"] < fused["regs"] <= 255
    assert plain["spill_bytes"] == 0


GDN_CODE = """
import json
from benchmarks import reg_usage
from synodic.kernels.gdn_replay.decode import _gdn_replay_decode_kernel as gdn
from synodic.kernels.mamba2_replay.decode import FOLDS
ptrs = dict(reg_usage.GDN_PTRS, lo_ptr="*fp32")
c = dict(HV=32, Hk=16, V=128, K=128, L=16, LP=16, BV=32, BK=128, USE_L2=True, ROUND_RU=False, ROUND_RK=False,
         TPP=1, RW=2 * 128 + 2 * 16 + 8, HAS_LO=False, CK_FP8=False, LO_FP8=False, ROUND_CK=False, ROUND_LO=False,
         ROUND_OUT=False)
print(json.dumps([reg_usage.compile_usage(gdn, ptrs, dict(c, ROUTE=r, FOLD=FOLDS[f], DOTS=d), 1)
                  for r, f in ((0, "serial"), (0, "dot"), (1, "serial")) for d in (False, True)]))
"""


@pytest.mark.skipif(not os.path.exists(TOOL), reason="Triton's NVIDIA backend tools are not installed")
def test_gdn_ring_dots_compiles_and_frees_registers():
    """The key-head prologue variant (DOTS) compiles for sm_90 on every route / fold (the interpreter does not type
    Triton's runtime branches) and its output-only launch holds fewer registers (no [L, K] key ring)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", GDN_CODE], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    usage = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(0 < u["regs"] <= 255 for u in usage)
    plain, plain_dots = usage[4:6]
    assert plain_dots["regs"] < plain["regs"] and plain_dots["spill_bytes"] == 0


M2_DOTS_CODE = """
import json
from benchmarks import reg_usage
from synodic.kernels.mamba2_replay.decode import FOLDS, _mamba2_replay_decode_kernel as m2
ptrs = dict(reg_usage.M2_PTRS, lo_ptr="*bf16")
c = dict(H=128, G=8, P=64, N=128, L=16, LP=16, BP=64, BN=128, HAS_Z=True, FOLD=FOLDS["tf32x3"], TPP=1, ROUTE=1,
         HAS_LO=True, CK_FP8=False, LO_FP8=False, ROUND_CK=False, ROUND_LO=False, ROUND_OUT=False, RW=18,
         CURSOR_FIRST=True, ROW_CURSOR=True, RING_BY_CURSOR=True)
print(json.dumps([reg_usage.compile_usage(m2, ptrs, dict(c, DOTS=d), 2) for d in (False, True)]))
"""


@pytest.mark.skipif(not os.path.exists(TOOL), reason="Triton's NVIDIA backend tools are not installed")
def test_mamba2_ring_dots_compiles_and_frees_registers():
    """The dual step's output-only launch with the group prologue (DOTS) compiles for sm_90 and holds fewer
    registers (no [L, N] B ring)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", M2_DOTS_CODE], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    plain, dots = json.loads(res.stdout.strip().splitlines()[-1])
    assert 0 < dots["regs"] < plain["regs"] <= 255 and dots["spill_bytes"] == 0
