"""`kv` group: KV residency policies for attention layers.

Top-k sparse attention is a property of the policy config: `top_k` applies to every attention layer
of the model (DSA-style: every layer selects its own top-k through the indexer). There is no
per-layer opt-out: the hot-buffer policies bound device memory only if every layer is sparse, and a
dense layer is what `kv=resident top_k=0` already is.

The indexer (`indexer`) is the model's learned DSA indexer when its attention layers carry one
(`auto`, the default, or `learned`), else the training-free one over copies of the model's keys
(`bf16` / `fp8`, also selectable on a model with a learned indexer, for comparison): synodic/kv/indexer.py.
"""
from typing import Literal

from pydantic import Field, model_validator

from synodic.config.registry import Component, register

from .indexer import index_kind

_INDEXER = ("which indexer selects the top-k: learned = the model's own learned DSA indexer (its keys k_I "
            "cached in learned_key_dtype; the model must have one, index_n_heads > 0); bf16 / fp8 = the "
            "training-free indexer over resident copies of the model's keys in that dtype (fp8 e4m3 with a "
            "per-token scale); auto = learned when the model's attention layers carry one, else bf16")
_LEARNED_KEYS = ("learned indexer: dtype of its cached keys k_I (fp8 e4m3 with one fp32 scale per token, "
                 "d_I + 4 bytes per token and layer as in DSA, or bf16, 2 * d_I bytes); unused by bf16 / fp8")
IndexerKind = Literal["auto", "learned", "bf16", "fp8"]


# selections are sized by top_k (and the hot buffer by 2 * top_k) whatever the context: a bound far past any
# context synodic serves keeps a typo from allocating or sorting for minutes
MAX_TOP_K = 1 << 20


@register("kv")
class ResidentKV(Component):
    """Paged KV cache in device memory with a block table (the baseline every policy must match)."""
    kind: Literal["resident"] = "resident"
    block_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    num_blocks: int = Field(2048, ge=1, description="pages in the device pool, shared by all requests")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="top-k sparse attention in every attention layer (each "
                       "query attends to the min(top_k, length) positions the indexer ranks highest); 0 = dense "
                       "attention")
    indexer: IndexerKind = Field("auto", description=_INDEXER + "; used when top_k > 0")
    learned_key_dtype: Literal["fp8", "bf16"] = Field("fp8", description=_LEARNED_KEYS)

    def capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks

    def build(self, ctx):
        index_kind(self, ctx.model)  # kv.indexer=learned on a model without one fails, even when dense
        if self.top_k > 0:
            from synodic.kv.topk import ResidentTopKPolicy
            return ResidentTopKPolicy(ctx.model, ctx.max_slots, ctx.device, self, ctx.max_seq_len)
        from synodic.kv.resident import ResidentKVPolicy
        return ResidentKVPolicy(ctx.model, ctx.max_slots, ctx.device, self, ctx.max_seq_len)


class _HostTiered(Component):
    block_size: int = Field(64, ge=1, le=1024, description="tokens per page, in the device pool, the host pool "
                            "and the indexer key cache alike")
    num_blocks: int = Field(2048, ge=1, description="pages in the device KV pool (what admission spends)")
    host_num_blocks: int = Field(4096, ge=1, description="pages in the host KV pool (every request's full KV; "
                                 "pinned memory on a GPU run), sized independently of device memory")
    index_num_blocks: int = Field(4096, ge=1, description="pages of the resident indexer key cache (every "
                                  "request's full length, low precision)")
    top_k: int = Field(2048, ge=1, le=MAX_TOP_K, description="positions each query attends to (capped by "
                       "length), in every attention layer")
    hot_buffer: int | None = Field(None, ge=1, le=2 * MAX_TOP_K, description="hot-buffer slots B per (request, "
                                   "layer), >= top_k; null = 2 * top_k")
    indexer: IndexerKind = Field("auto", description=_INDEXER)
    learned_key_dtype: Literal["fp8", "bf16"] = Field("fp8", description=_LEARNED_KEYS)
    shared_retrieval: bool = Field(True, description="speculative verify windows: the window's queries share one "
                                   "host fetch of their missed rows per (request, layer) (false: every query fetches "
                                   "its own misses; the ledger reports both counts either way)")

    @model_validator(mode="after")
    def _buffer(self):
        if self.hot_buffer is not None and self.hot_buffer < self.top_k:
            raise ValueError(f"kv.hot_buffer={self.hot_buffer} with kv.top_k={self.top_k}: expected kv.hot_buffer >= "
                             "kv.top_k")
        return self

    @property
    def B(self) -> int:
        return self.hot_buffer or 2 * self.top_k

    def window_pages(self, window: int) -> int:
        """Pages a verify window of `window` tokens can touch (adaptive: tail pages; hisparse: draft pages)."""
        return 1 if window <= 1 else -(-(window - 1) // self.block_size) + 1

    def capacity_tokens(self) -> int:
        return self.block_size * self.host_num_blocks


@register("kv")
class HiSparseKV(_HostTiered):
    """Full KV in host memory; per (request, layer) a device hot buffer of B slots + a newest-token slot
    under per-layer LRU, one fused resolve per layer (hits, victims, recency, host→device copy of misses)."""
    kind: Literal["hisparse"] = "hisparse"
    draft_pages: int = Field(0, ge=0, description="device pages per request for a speculative verify window "
                             "(the draft zone: the window's tail pages, outside the hot buffer's LRU); 0 = no "
                             "verify windows")

    def build(self, ctx):
        index_kind(self, ctx.model)
        window = getattr(ctx, "window", 1)
        need = self.window_pages(window)
        if window > 1 and need > self.draft_pages:
            from synodic.config.errors import ConfigError
            raise ConfigError([f"kv.draft_pages={self.draft_pages} with a verify window of {window} tokens and "
                               f"kv.block_size={self.block_size}: expected kv.draft_pages >= {need} (kv=hisparse "
                               "keeps a window's rows in draft pages outside the hot buffer)"])
        from synodic.kv.hisparse import HiSparsePolicy
        return HiSparsePolicy(ctx.model, ctx.max_slots, ctx.device, self, ctx.max_seq_len, window,
                              getattr(ctx, "host_buffer", None))


@register("kv")
class AdaptiveKV(_HostTiered):
    """Residency follows load: full device residency while pages last; under pressure requests are demoted
    page by page (coldest first) to hot-buffer mode keeping tail pages, the newest token and the current
    top-k on the device; three-way resolve (resident page → hot row → host); promotion when pressure falls."""
    kind: Literal["adaptive"] = "adaptive"
    tail_pages: int = Field(2, ge=1, description="newest pages of each request that always stay resident "
                            "(protected working set; holds the newest token)")
    promote_free_fraction: float = Field(0.25, ge=0.0, le=1.0, description="promote demoted pages back only "
                                         "while at least this fraction of device pages stays free afterwards")
    promote_pages_per_step: int = Field(8, ge=0, description="most pages promoted back (host → device) per "
                                        "decode step; 0 = never promote")
    drafter_ring_in_budget: bool = Field(False, description="a neural drafter's context K/V ring (spec.context_window "
                                         "rows per slot, on the device) is taken out of the device pool: the pages "
                                         "its bytes fill are withheld from admission, demotion and promotion")

    def build(self, ctx):
        index_kind(self, ctx.model)
        window = getattr(ctx, "window", 1)
        need = self.window_pages(window)
        if need > self.tail_pages:
            from synodic.config.errors import ConfigError
            raise ConfigError([f"kv.tail_pages={self.tail_pages} with a verify window of {ctx.window} tokens and "
                               f"kv.block_size={self.block_size}: expected kv.tail_pages >= {need} (the window's rows "
                               "must stay in resident tail pages)"])
        from synodic.kv.adaptive import AdaptivePolicy
        return AdaptivePolicy(ctx.model, ctx.max_slots, ctx.device, self, ctx.max_seq_len, window,
                              getattr(ctx, "host_buffer", None))
