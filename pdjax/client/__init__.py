"""Clients of an OpenAI-compatible server: `bench` (the benchmark client behind
`pdjax.bench_serve`: streamed requests at a workload's arrival times, client-side latencies,
vllm bench serve's result keys)."""
