"""The capacity planner behind `pdjax.plan` (pure Python: it runs the simulator).

`search`: the placements of a chip budget and the rate search, independent of how a placement
is evaluated; `placement_runs`: one placement's simulated run at a rate (whether it fits the
chips, its config and pools, whether it sustains the rate); `capacity`: per-instance memory,
whether a model fits on TP chips and how many KV pages remain; `slo_grid`: per-request
latencies once, SLO attainment for any (TTFT, TPOT) target afterwards; `workload_mix`,
`mixes`: the planner's workloads (a trace's lengths at Poisson rates, named mixes);
`plan_output`: plan.csv, plan.md and its plot; `map_mode`, `map_search`, `map_output`:
`plan.mode=map`, who wins where over a grid of SLOs and workload mixes.
"""
