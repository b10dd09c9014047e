"""Plain colocated vs chunked prefill vs disaggregated over a rate sweep (same chips).

Run:   python -m pdjax.sweep --config=configs/colocated_vs_disagg.py
Expect: sweep.md with three rows per rate, plots/goodput.png (attainment vs rate per run) and
the per-chip goodput of each run (DistServe's definition, at slo.attainment).
"""

from pdjax.config import sibling_config

default = sibling_config(__file__)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "compare"
  c.workload.num_requests = 64
  # SLOs tight enough for the tiny model on a CPU that attainment falls inside the rate range.
  c.slo.ttft_s = 0.2
  c.slo.tpot_s = 0.03
  return c


def get_sweep():
  return [{"workload.rate": r} for r in (4.0, 8.0, 16.0, 32.0)]
