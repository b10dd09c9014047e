"""The planner's shipped default: `python -m pdjax.plan` with no --config plans this.

  python -m pdjax.plan                                   # same as --config=configs/plan_default.py

Llama-3-8B (bf16, a published shape) on 2 H100s (roofline preset), a ShareGPT-like chat mix
(log-normal lengths, prompt mean 161 / output mean 338 tokens, as the vLLM paper samples
ShareGPT; pdjax/planning/mixes.py `sharegpt`), Poisson arrivals, and chat SLOs: TTFT 250 ms,
TPOT 50 ms (20 tokens/s, faster than reading) for 90% of requests. Every simulated rate holds at
least 60 s of arrivals: a request here lives ~3 s (338 tokens x ~10 ms decode steps), so a
window holds ~20 lifetimes and a queue that grows at an overloaded rate shows (its TTFTs pass
250 ms, and its latencies grow from the middle to the last third of arrivals: see
slo_grid.RunRecord.stable). 300 requests at ~60 req/s would be a 5 s window, barely one
lifetime, where an overloaded placement still looks fine.

The budget is 2 chips at TP 1 and 2 (5 placements) so that the whole search fits ~4 minutes on a
2-core CPU: a simulated run costs about its requests x output length, and 4 chips double every
rate and more than double the placements. For a real question, set plan.chip_budget and
plan.tp_choices (configs/distserve_repro.py: 8 x A100, 66B-class model).

Result (216 s wall, 175 s CPU, on the shared 2-core CPU; every search found a failing rate):
  chunked 2xTP1 39.0, chunked 1xTP2 34.5, colocated 2xTP1 31.5, colocated 1xTP2 27.75,
  disaggregated 1xP(tp1) + 1xD(tp1) 22.0 req/s per chip: disaggregated / colocated 0.70x,
  / chunked 0.56x. On 2 chips a disaggregated placement has one decode instance (128 running
  sequences) where the colocated ones have two. With 10 s windows instead of 60 s
  (--config.plan.min_duration_s=10) the same search reads 37.5 / 43.5 / 28.5 for the TP1
  colocated / chunked / disaggregated placements: a short window overstates by 12-30%.
This file ships with the package; configs/plan_default.py in a clone re-exports it.
"""

from pdjax.config import sibling_config
from pdjax.configs import simulate_published_shape
from pdjax.planning.mixes import MIXES


def get_config(arg=None):
  c = sibling_config(__file__).get_config()
  c.mode = "compare"
  simulate_published_shape(c, "llama3_8b", "h100")
  c.scheduler.chunk_budget = 512                    # chunked prefill: 512 tokens per step
  for key, value in MIXES["sharegpt"].items():      # lognormal 161 / 338, caps 1024 / 1024
    c.workload[key] = value
  c.workload.rate = 8.0
  c.workload.num_requests = 400
  c.slo.ttft_s = 0.25
  c.slo.tpot_s = 0.05
  c.slo.attainment = 0.9
  c.plan.chip_budget = 2
  c.plan.tp_choices = (1, 2)
  c.plan.num_requests = 300                 # per simulated rate, and at least
  c.plan.min_duration_s = 60.0              #   60 s of arrivals (~20 request lifetimes)
  c.plan.rate_lo = 16.0                     # req/s of the whole placement: search from
  c.plan.rate_hi = 48.0                     #   [16, 48], doubling 48 while it passes
  c.plan.rel_tol = 0.05
  c.progress = False
  if arg:
    raise ValueError(f"unknown variant {arg!r} (this config has none)")
  return c
