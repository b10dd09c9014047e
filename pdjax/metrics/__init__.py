"""Serving metrics (TTFT, TPOT, ITL, E2E, SLO attainment, goodput) and run reports.

`summary` computes a run's metrics, `report` writes its artifacts (summary.json, report.md,
requests.jsonl; sections in `report_sections`), `compare` and `sweep_tables` put runs side by
side, `intervals` the confidence intervals over repeats, `goodput` the rate search, `benefit`
disaggregation's net benefit per prompt length. Per-instance views: `timeline` (and
`timeline_bins`), `host_time`, `kv_cache`, `faults`, `run_info`; `trace` (with `trace_bins`,
`trace_format`) the Chrome / Perfetto trace; `plots` the PNGs; `columns` numpy columns of
a run's records.
"""
