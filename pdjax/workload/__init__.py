"""Request workloads for benchmarking the serving engine.

Entry point: `loader.load_workload` (a config's `workload` section -> Requests + problems).
Synthetic: `arrivals` (when) x `presets` (what). Traces: `traces` (parse) -> `replay` (grain).
"""
