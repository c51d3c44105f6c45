"""The KV residency policy base: what the engine, the runner and the attention layers may ask of any
`kv` policy, with the default for every optional capability (a policy overrides what it has)."""
class KVPolicy:
    """Base of every `kv` policy. Subclasses own `blocks` (the page accounting the scheduler grows) and
    provide bind / view_blocks_for / write_prefill / attend / attend_window / bytes_for."""

    # A decode step reads only fixed-address tensors, so the runner may capture it in a CUDA graph.
    graph_safe = False
    # Nothing on the host waits for the step in flight, so the engine may queue the next step first.
    overlap_safe = False
    # The attention layers hand the policy their learned indexer's outputs (index=...).
    learned_index = False
    # Sparse prefill: a policy that attends the prompt itself defines prefill_attend(...) as a method;
    # prompts then prefill one per forward.
    prefill_attend = None

    def graph_key(self) -> tuple:
        """Host state that picks a decode step's code path: one captured graph per distinct key."""
        return ()

    def after_step(self) -> None:
        """Queued right behind each decode step (the policy's per-step read-back of ledger counters)."""

    def quiesce_host(self) -> None:
        """Join any host-side copy still in flight (before a CUDA-graph capture)."""

    def commit(self, accepted) -> None:
        """After a verify window: accepted[n] (a device tensor, 1..T) of row n's window tokens are kept. A policy
        that keeps window rows in reserved rows until acceptance moves the accepted ones here (on the device)."""
