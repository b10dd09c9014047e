"""Where disaggregation wins: the planner's map over SLOs x workload mixes (issue 17).

  python -m pdjax.plan --config=configs/where_disagg_wins.py --workdir=DIR       # Llama-3-8B
  python -m pdjax.plan --config=configs/where_disagg_wins.py:70b --workdir=DIR   # Llama-3-70B

Llama-3-8B and Llama-3-70B (bf16) on 8 chips of h100 and of tpu_v5p (roofline presets, TP
all-reduces charged), four length mixes (pdjax/planning/mixes.py: sharegpt, long_prompt and
stand-ins for the Azure 2023 conversation and code traces), Poisson arrivals. For every
(TTFT, TPOT) target pair of the grid below: the best per-chip goodput at 90% attainment of
colocated (prefill first), chunked-prefill and disaggregated placements, which wins and by how
much. Results and reading: experiments/where_disagg_wins/README.md. With
`--config.plan.map_hybrid=isl_bounding,slo_headroom` the map also scores hybrid splits (decode
instances that may prefill locally) by Dynamo's rule and by predicted SLO headroom.

The default (same as `:8b`) maps Llama-3-8B (TP1); `:70b` maps Llama-3-70B with its two
smallest TP degrees that keep room for KV, every disaggregated split of the 8 chips (mixed TP
included), a TPOT grid from 20 ms (its decode step is ~18 ms at TP4) and 40 s arrival windows
(its requests live ~3x longer, and a window must hold several lifetimes for an overloaded
queue to show); `:quick` is Llama-3-8B on h100 with two mixes.
"""

from pdjax.config import sibling_config
from pdjax.configs import simulate_published_shape


def get_config(arg=None):
  c = sibling_config(__file__).get_config()
  c.mode = "compare"
  simulate_published_shape(c, "llama3_8b", "h100", max_model_len=8192,   # a whole 8k prompt
                           prefill_buckets=(512, 2048, 8192))         # fits one prefill step
  c.scheduler.chunk_budget = 512                    # chunked prefill: 512 tokens per step
  c.scheduler.length_threshold = 2048   # isl_bounding (plan.map_hybrid): Dynamo's defaults,
  c.scheduler.isl_ratio = 0.7           #   local when eff_isl < 2048 and < 0.7 x the prompt
  c.scheduler.local_prefill = "chunked"  # hybrid: a local prompt rides the decode batch in
                                         #   512-token chunks (disaggregated: decode
                                         #   instances only prefill to recompute)
  c.workload.preset = "lognormal"           # the mixes set the lengths (planning/mixes.py)
  c.workload.rate = 2.0
  c.workload.num_requests = 400
  c.slo.ttft_s = 0.4                        # plain planner runs; the map uses its grid
  c.slo.tpot_s = 0.1
  c.slo.attainment = 0.9
  c.plan.chip_budget = 8
  c.plan.tp_choices = (1, 2, 4, 8)
  c.plan.num_requests = 100                 # per simulated rate, and at least
  c.plan.min_duration_s = 6.0               #   6 s of arrivals (short: see the README)
  c.plan.map = True
  c.plan.map_models = "llama3_8b"           # Llama-3-70B: the :70b variant (longer windows)
  c.plan.map_hardware = "h100,tpu_v5p"
  c.plan.map_mixes = "sharegpt,long_prompt,azure_conv,azure_code"
  c.plan.map_ttft_s = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
  c.plan.map_tpot_s = (0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15)
  c.plan.map_rate_min = 0.0625
  c.plan.map_rate_max = 128.0
  c.plan.map_rate_factor = 2 ** 0.5
  c.plan.map_rate_start = 1.0
  c.plan.map_tp_count = 1                   # 8B: TP1; 70B: TP4 on h100, TP2 on tpu_v5p
  c.plan.map_full_budget = True
  c.plan.map_max_disagg = 4
  c.progress = False
  if arg == "quick":
    c.plan.map_models = "llama3_8b"
    c.plan.map_hardware = "h100"
    c.plan.map_mixes = "sharegpt,azure_code"
  elif arg == "8b":                         # the default, named
    pass
  elif arg == "70b":
    c.plan.map_models = "llama3_70b"
    c.plan.map_tp_count = 2                 # h100: TP4, TP8; tpu_v5p: TP2, TP4
    c.plan.map_max_disagg = 0               # every full-budget split, mixed TP included
    c.plan.map_tpot_s = (0.02, 0.025, 0.03, 0.04, 0.06, 0.1, 0.15)   # a TP4 decode step: ~18 ms
    c.plan.min_duration_s = 40.0            # a 70B request lives ~3x longer than an 8B one
  elif arg:
    raise ValueError(f"unknown variant {arg!r} (known: quick, 8b, 70b)")
  return c
