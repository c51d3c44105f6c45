"""Scripts that measure (kernel benchmarks, the KV long-context and profiling tools, the register probe)
and the packed kernels' tuner; run from a checkout as `python -m benchmarks.<name>` (see README.md here).
Not part of the installed package: the library never imports them."""
