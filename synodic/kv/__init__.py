"""KV residency: paged pool, host pool, hot buffers and the residency policies (`kv` group)."""
