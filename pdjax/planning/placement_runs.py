"""The planner's runs of one placement (`pdjax.plan` and its map mode, planning/map_mode.py):
whether it fits the chips (each tier's KV pool from the memory its weights leave), its
simulated config at a rate (each tier over as many hosts as its TP needs: tier_hosts), one
simulated run of it (runner.execute), the rule of what it sustains at the config's SLO, and the
checks of the plan.* settings.

A run at rate r offers requests_needed = max(plan.num_requests, ceil(r x plan.min_duration_s))
requests, and costs about that times the output length: a placement that passes every rate
(a toy model on a big chip) would climb to millions of requests per run. A rate needing more
than plan.max_requests_per_run (0: no bound) is not run (within_bound): the search or walk
stops there and its answer is a lower bound ("not reached")."""

from __future__ import annotations

import math
import operator
import sys

from pdjax import config as config_lib
from pdjax.planning import capacity, workload_mix
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import RunRecord


def pools(cfg, mcfg, p: Placement) -> list[int] | None:
  """Each tier's KV pages per instance from its chips' memory (None: a tier cannot hold one
  kv.max_model_len sequence)."""
  from pdjax.sim.hardware import hardware_for
  out = [capacity.pool_pages(mcfg, hardware_for(cfg.sim.hardware), tp, page_size=cfg.kv.page_size,
                             dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4,
                             mem_util=cfg.plan.mem_util, max_model_len=cfg.kv.max_model_len,
                             max_batch=max(cfg.scheduler.decode_buckets))
         for _, _, tp in p.tiers]
  return None if None in out else out


def placement_config(cfg, mcfg, p: Placement, rate: float,
                     trace: workload_mix.TraceLengths | None = None):
  """The sim config of one placement at one rate (None when it does not fit in memory).
  trace: cfg's workload as resampled lengths (required when the workload is a trace)."""
  pages = pools(cfg, mcfg, p)
  if pages is None:
    return None
  new = cfg.copy_and_resolve_references()
  new.backend, new.mode, new.progress = "sim", p.mode, False
  if p.run == "hybrid":   # (hybrid instances: taichi, with the config's SLO unless a map
    new.scheduler.path = p.path or "taichi"   # cell sets it: map_instances)
  if p.run == "chunked":
    new.mode = "colocated"
    new.scheduler.colocated_policy = "chunked_prefill"
  for role, n, tp in p.tiers:
    new.cluster[role].instances, new.cluster[role].tp = n, tp
  for role, budget in zip(("p_heavy", "d_heavy"), p.chunks):
    new.cluster[role].chunk_budget = budget
  if p.mode in ("disaggregated", "hybrid"):   # the unused tiers must still validate
    new.cluster.colocated.tp = p.tiers[0][2]
    if p.mode == "hybrid":
      new.cluster.prefill.tp, new.cluster.decode.tp = p.tiers[0][2], p.tiers[1][2]
  else:
    new.cluster.prefill.tp = new.cluster.decode.tp = p.tiers[0][2]
  for role in ("prefill", "decode", "colocated"):   # as many hosts as its chips need
    with new.unlocked():   # (an older config may lack the key)
      new.cluster[role].hosts = tier_hosts(cfg, new.cluster[role].tp)
  for (role, _, _), n_pages in zip(p.tiers, pages):
    new.cluster[role].kv_pages = n_pages     # each tier's pool from its own chips' memory
  new.kv.pages_per_instance = min(pages)
  new.workload.rate = float(rate)
  # Enough arrivals that the window is long against a request's lifetime at every rate: a
  # fixed count at a high rate ends before queues reach their steady state.
  n = requests_needed(cfg.plan, rate)
  new.workload.num_requests = n
  if cfg.workload.kind != "synthetic":
    if trace is None:
      raise ValueError("a trace workload is planned from its resampled lengths: pass trace")
    for key, value in trace.workload(n, rate).items():
      new.workload[key] = value
  return new


def tier_hosts(cfg, tp: int) -> int:
  """The hosts an instance of `tp` chips of sim.hardware spans: the fewest whose chips hold it
  (ceil(tp / chips_per_host), a divisor of tp); its TP all-reduces then cross the inter-host
  link (sim/roofline.py)."""
  from pdjax.sim.hardware import hardware_for
  return hardware_for(cfg.sim.hardware).hosts_for(tp)


def requests_needed(p, rate: float) -> int:
  """The requests a run at `rate` req/s offers (p: cfg.plan)."""
  return max(p.num_requests, math.ceil(rate * p.min_duration_s))


def within_bound(p, rate: float) -> bool:
  """Whether a run at `rate` fits plan.max_requests_per_run (0: no bound); picklable with
  functools.partial, for a pool."""
  bound = p.get("max_requests_per_run", 0)
  return not bound or requests_needed(p, rate) <= bound


def not_reached_text(p, rate: float) -> str:
  """Why a rate was not run."""
  return (f"{rate:g} req/s would need {requests_needed(p, rate)} requests > "
          f"plan.max_requests_per_run={p.max_requests_per_run}")


def evaluate(cfg, mcfg, p: Placement, rate: float,
             trace: workload_mix.TraceLengths | None = None) -> RunRecord:
  """One simulated run of the placement at `rate` req/s: its per-request latencies (without
  the run summary, which the planner does not read: 3% of a map's time)."""
  from pdjax.runner.execute import execute
  run_cfg = placement_config(cfg, mcfg, p, rate, trace)
  _, result, _ = execute(run_cfg, mcfg, p.mode, None, quiet=True, summarize=False)
  return RunRecord.from_requests(rate, result.requests)


def sustains(cfg):
  """The rule of what a placement sustains, for this config's SLO (RunRecord.meets);
  picklable, for a pool (planning/pool.py)."""
  return operator.methodcaller("meets", cfg.slo.ttft_s, cfg.slo.tpot_s, cfg.slo.attainment)


def fits(cfg, mcfg, p: Placement) -> bool:
  return pools(cfg, mcfg, p) is not None


def tp_ok(mcfg, tp: int) -> bool:
  return all(n % tp == 0 for n in (mcfg.num_kv_heads, mcfg.num_heads, mcfg.intermediate_size))


def warn_if_tiny(cfg, mcfg) -> None:
  """run_info's one-line warning for a simulated `tiny` preset, on stderr."""
  from pdjax.metrics.run_info import backend_info, model_info, tiny_sim_warning
  if (warning := tiny_sim_warning({"backend": backend_info(cfg),
                                   "model": model_info(cfg, mcfg)})):
    print(warning, file=sys.stderr)


def check_plan(p) -> None:
  if p.min_duration_s < 0:
    raise config_lib.ConfigError(f"plan.min_duration_s={p.min_duration_s} must be >= 0")
  if p.chip_budget < 2 or p.num_requests < 1 or not 0 < p.rate_lo < p.rate_hi:
    raise config_lib.ConfigError(
        f"plan.chip_budget={p.chip_budget} (>= 2), plan.num_requests={p.num_requests} "
        f"(>= 1), plan.rate_lo={p.rate_lo} < plan.rate_hi={p.rate_hi} (> 0) required")
  bound = p.get("max_requests_per_run", 0)
  if bound and bound < p.num_requests:    # (negative included)
    raise config_lib.ConfigError(
        f"plan.max_requests_per_run={bound} must be 0 (no bound) or >= plan.num_requests="
        f"{p.num_requests}")
  if not within_bound(p, p.rate_lo):
    raise config_lib.ConfigError(
        f"plan.rate_lo={p.rate_lo:g} req/s needs {requests_needed(p, p.rate_lo)} requests (>= "
        f"{p.min_duration_s:g} s of arrivals) > plan.max_requests_per_run={bound}: lower "
        f"plan.rate_lo or plan.min_duration_s")
