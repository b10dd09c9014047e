"""DistServe's chatbot experiment, in direction, on the simulator (issue 5).

  python -m pdjax.plan --config=configs/distserve_repro.py                 # ShareGPT-like mix
  python -m pdjax.plan --config=configs/distserve_repro.py:long_prompts    # longer prompts

A 66B-class model (Llama-1 65B shapes standing in for OPT-66B) on one node of 8 A100-80GB
(roofline preset, NVLink P->D link), Poisson arrivals, log-normal prompt/output lengths,
DistServe's chatbot SLOs: TTFT 0.4 s, TPOT 0.1 s at 90% attainment. The planner searches
disaggregated placements and compares with colocated (vLLM-like continuous batching,
prefill first) and chunked prefill on the same 8 chips. What is assumed is listed in
experiments/distserve_repro/README.md.
"""

from pdjax.config import sibling_config
from pdjax.configs import simulate_published_shape


def get_config(arg=None):
  c = sibling_config(__file__).get_config()
  c.mode = "compare"
  simulate_published_shape(c, "llama_65b", "a100")
  c.scheduler.chunk_budget = 512
  c.workload.preset = "lognormal"
  c.workload.lognormal_prompt_mean = 161.0  # ShareGPT as sampled in the vLLM paper (means)
  c.workload.lognormal_output_mean = 338.0
  c.workload.lognormal_sigma = 1.0
  c.workload.lognormal_max_prompt_len = 1024   # as ShareGPT benchmarks filter (prompt <= 1024,
  c.workload.lognormal_max_output_len = 1024   #   prompt + output <= 2048)
  c.workload.rate = 2.0
  c.workload.num_requests = 400
  c.slo.ttft_s = 0.4
  c.slo.tpot_s = 0.1
  c.slo.attainment = 0.9
  c.plan.chip_budget = 8
  c.plan.tp_choices = (1, 2, 4, 8)
  c.plan.num_requests = 1200                # and >= 120 s of arrivals: many request
  c.plan.min_duration_s = 120.0             #   lifetimes (~13 s) at every rate
  c.plan.rate_lo = 0.25
  c.plan.rate_hi = 4.0
  c.plan.rel_tol = 0.05
  c.progress = False
  if arg == "long_prompts":
    c.workload.lognormal_prompt_mean = 755.0
    c.workload.lognormal_output_mean = 200.0
  elif arg:
    raise ValueError(f"unknown variant {arg!r} (known: long_prompts)")
  return c
