"""Swap the KV policy of a built ServingGraph for a fresh one, on the same model.

Benchmarks that compare KV policies on one large model (random weights of the 7B DSA preset take ~20 s
to build on the GPU) build the graph once and call `rebuild_kv` per variant. The old policy is
released first (pending host backups joined, device memory returned to the allocator) so two pools
never coexist; CUDA graphs follow the same rule as `build_graph` (`check_cuda_graphs`: every built-in
policy, dense or top-k, is captured; one that is not graph-safe runs uncaptured).
"""
from __future__ import annotations

import gc

import torch


def free_kv(graph) -> None:
    """Drop graph.kv and return its device memory (pinned host blocks stay in torch's host cache and
    are reused by the next pool of the same size)."""
    old, graph.kv = graph.kv, None
    host = getattr(old, "host", None)
    if host is not None:
        host.wait_all()
    del old, host
    gc.collect()
    if graph.device.type == "cuda":
        torch.cuda.synchronize(graph.device)
        torch.cuda.empty_cache()


def rebuild_kv(graph, kv_cfg, max_seq_len: int | None = None, window: int = 1, host_buffer=None):
    """graph.kv ← kv_cfg.build(...) on graph.model (after freeing the old policy); returns the policy.
    graph.cuda_graphs and graph.overlap are recomputed from the run config for the new policy.
    host_buffer: a byte buffer (pinned on a GPU run) a host-tiered policy's host pool takes its rows from, so
    successive policies reuse one pinned allocation (synodic/kv/host_pool.py)."""
    from synodic.graph import BuildContext, check_cuda_graphs, check_overlap
    free_kv(graph)
    if max_seq_len is not None:
        graph.max_seq_len = max_seq_len
    ctx = BuildContext(model=graph.model, device=graph.device, max_slots=graph.max_slots,
                       max_seq_len=graph.max_seq_len, window=window, host_buffer=host_buffer)
    graph.kv = kv_cfg.build(ctx)
    try:
        graph.cfg = graph.cfg.model_copy(update={"kv": kv_cfg})
    except AttributeError:  # a plain namespace config
        pass
    asked = graph.cfg.runtime.cuda_graphs
    graph.cuda_graphs = graph.device.type == "cuda" if asked is None else asked
    graph.notes = [n for n in graph.notes if not n.startswith("cuda_graphs off: kv=")]
    check_cuda_graphs(graph, kv_cfg, asked)
    graph.overlap = check_overlap(graph, kv_cfg, graph.cfg.runtime.overlap)
    return graph.kv
