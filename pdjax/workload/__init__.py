"""Request workloads for benchmarking the serving engine."""
