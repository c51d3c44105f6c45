"""GPU-only: the engine with Triton kernels and CUDA graphs gives the same tokens as without graphs,
and ssm=replay the same as ssm=eager (fp32 model). Skips cleanly without a GPU."""
import pytest
import torch

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9, list(range(1, 30))]


def _serve(overrides, engine=False):
    cfg = compose(["runtime.device=cuda", "model.weights=random", *overrides])
    reqs = [Request(i, p, SamplingParams(max_tokens=40)) for i, p in enumerate(PROMPTS)]
    eng = Engine(build_graph(cfg, max_seq_len=96))
    eng.generate(reqs)
    return ([r.output_ids for r in reqs], eng) if engine else [r.output_ids for r in reqs]


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
def test_cuda_graphs_and_replay_match(preset):
    ref = _serve([f"model={preset}", "runtime.cuda_graphs=false"])
    assert _serve([f"model={preset}", "runtime.cuda_graphs=true"]) == ref
    assert _serve([f"model={preset}", "runtime.cuda_graphs=true", "ssm=replay", "ssm.precision=fp32"]) == ref


TIERED = ["model=tiny_dsa", "kv.top_k=4", "kv.block_size=2", "kv.hot_buffer=6", "kv.host_num_blocks=256",
          "kv.index_num_blocks=256"]


@pytest.mark.parametrize("overrides", [["model=tiny_gdn", "ssm=replay"],
                                       ["model=tiny_mamba2", "kv.block_size=4", "runtime.max_slots=2",
                                        "kv.num_blocks=40"],
                                       ["kv=hisparse", *TIERED, "kv.num_blocks=64"],
                                       ["kv=adaptive", *TIERED, "kv.num_blocks=60", "kv.tail_pages=1"]])
def test_overlapped_steps_match_synced_on_gpu(overrides):
    """Pinned staging, device token feedback, asynchronous read-back and page-table copies with CUDA graphs:
    the same tokens as one host sync per step (small pages: rows take new pages inside overlapped chains; top-k
    policies: host fetches, demotions and promotions between overlapped steps)."""
    ref, ref_eng = _serve(["runtime.overlap=false", *overrides], engine=True)
    out, eng = _serve(["runtime.overlap=true", *overrides], engine=True)
    assert out == ref and eng.overlapped_steps > 0
    if "kv=hisparse" in overrides or "kv=adaptive" in overrides:  # fetch counters read back per step
        kv = eng.ledger.summary()["kv"]
        assert kv == ref_eng.ledger.summary()["kv"] and kv["host_fetched_rows"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_without_dense_copy_matches_with_it(dtype, tmp_path, monkeypatch):
    """quant.dense_copy=false gives the tokens of the model that keeps dense copies: decode rows within the packed
    kernel's limit take the same kernel in both, and prefill the dense matmul on bit-identical weights (the kept
    copy vs the per-call Triton dequant)."""
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(tmp_path))
    q = ["model=tiny_mamba2", f"model.dtype={dtype}", "quant=mxfp4", "quant.method=rtn", "quant.artifact=none"]
    assert _serve([*q, "quant.dense_copy=false"]) == _serve([*q, "quant.dense_copy=true"])
