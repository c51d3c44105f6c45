"""`kv` group: KV residency policies for attention layers."""
from typing import Literal

from pydantic import Field

from synodic.config.registry import Component, register


@register("kv")
class ResidentKV(Component):
    """Paged KV cache in device memory with a block table (the baseline every policy must match)."""
    kind: Literal["resident"] = "resident"
    block_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    num_blocks: int = Field(2048, ge=1, description="pages in the device pool, shared by all requests")

    def capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks

    def build(self, ctx):
        from synodic.kv.resident import ResidentKVPolicy
        return ResidentKVPolicy(ctx.model, ctx.max_slots, ctx.device, self, ctx.max_seq_len)
