"""Capacity planner: the placement with the highest per-chip goodput at the config's SLOs.

  python -m pdjax.plan                        # configs/plan_default.py (Llama-3-8B, h100)
  python -m pdjax.plan --config=configs/distserve_repro.py [--workdir=DIR]
  python -m pdjax.plan --config.plan.chip_budget=16 --config.plan.tp_choices="(2,4,8)"

Without --config it plans pdjax/configs/plan_default.py, not the run's default (the `tiny` toy
model, whose simulated numbers describe no real model). Runs on the simulator (backend=sim,
whatever the config says): for every placement within plan.chip_budget chips of sim.hardware
that fits in memory — disaggregated (n_p x TP t_p prefill + n_d x TP t_d decode), and
colocated with prefill_first and with chunked prefill — it searches the highest request rate
(Poisson arrivals of the config's workload, plan.num_requests requests, more when the rate is
high: at least plan.min_duration_s seconds of arrivals) the placement sustains, and ranks
placements by that rate per chip. "Sustains" is one rule for this planner and its map
(slo_grid.RunRecord.meets): SLO attainment (slo.ttft_s, slo.tpot_s) >= slo.attainment and no
latency growth over the run's arrivals (a queue that grows is overload, whatever the
attainment over a short window). A search that finds no failing rate up to its cap (rate_hi x
2^12) reports no goodput for that placement and says why (planning/plan_output.py); so does one
stopped at a rate whose run would need more than plan.max_requests_per_run requests (10,000 by
default; "not reached": the `tiny` preset on h200 passes every rate, and at 60 s of arrivals per
rate its search would otherwise climb to millions of requests per run and not answer). A trace
workload is planned from its rows' lengths at Poisson rates (planning/workload_mix.py). KV
pages per instance come from the chips' memory left after the weights (plan.mem_util of HBM).

The placements' searches (and the map's walks) run in a pool of plan.workers processes (0, the
default: one per core; 1: in-process), results in the placements' order, so the files are the
same whatever the pool (planning/pool.py).

Writes DIR/plan.md and plan.csv (ranked; `saturated` says whether a failing rate was found),
plots/plan.png, and prints what ran, the best colocated, chunked and disaggregated placements
side by side, and why any placement has no number.

Map mode (plan.map=True): the same placements over a grid of SLOs (plan.map_ttft_s x
plan.map_tpot_s), workload mixes (plan.map_mixes), models (plan.map_models) and hardware
(plan.map_hardware): which kind wins each cell and by how much, as map.csv, map.md and a
phase diagram per model and hardware (pdjax/planning/map_mode.py; default DIR: map-<name>):

  python -m pdjax.plan --config=configs/where_disagg_wins.py
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax.cli import define_config_and_workdir, fail, parse_flags
from pdjax.planning import plan_output, workload_mix
from pdjax.planning.placement_runs import (check_plan, evaluate, fits, not_reached_text,
                                           placement_config, sustains, tp_ok, warn_if_tiny,
                                           within_bound)
from pdjax.planning.search import PlanRow, placements, rate_cap, search
from pdjax.runner.outputs import default_workdir

PLAN_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                            "plan_default.py")
CONFIG = WORKDIR = None   # the --config and --workdir holders, defined by entry_point


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  cfg = CONFIG.value
  try:
    sim_cfg = cfg.copy_and_resolve_references()
    sim_cfg.backend = "sim"
    mcfg = config_lib.validate(sim_cfg)
    p = cfg.plan
    check_plan(p)
    if p.get("map", False):
      from pdjax.planning import map_mode
      map_mode.settings(cfg)
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  default = default_workdir(flags.FLAGS["config"].config_filename)
  prefix = "map-" if p.get("map", False) else "plan-"
  workdir = WORKDIR.value or os.path.join(os.path.dirname(default),
                                          prefix + os.path.basename(default))
  command = " ".join(["python -m pdjax.plan", *sys.argv[1:]])
  if p.get("map", False):
    try:
      print(map_mode.run_map(cfg, workdir, command=command))
    except (config_lib.ConfigError, ValueError) as e:
      fail(f"config error: {e}")
    print(f"results: {workdir}")
    return
  warn_if_tiny(sim_cfg, mcfg)
  try:
    trace = workload_mix.trace_lengths(sim_cfg, mcfg,
                                       os.path.join(workdir, "workload_resampled.jsonl"))
  except ValueError as e:
    fail(f"config error: {e}")
  candidates = [c for c in placements(p.chip_budget, p.tp_choices, lambda t: tp_ok(mcfg, t))
                if fits(sim_cfg, mcfg, c)]
  if not candidates:
    fail(f"config error: no placement of {p.tp_choices} on {p.chip_budget} x "
         f"{cfg.sim.hardware} holds the model and one {cfg.kv.max_model_len}-token sequence")
  print(f"searching {len(candidates)} placements", file=sys.stderr)
  done = []
  def progress(row: PlanRow) -> None:
    done.append(row)
    if row.rate is not None:
      found = f"{row.per_chip:.3f} req/s/chip"
    elif row.search.not_reached is not None:
      found = f"not reached: {not_reached_text(p, row.search.not_reached)}"
    elif row.search.rate is None:
      found = f"fails at plan.rate_lo={p.rate_lo:g} req/s"
    else:
      found = f"no failing rate up to {rate_cap(p.rate_hi):g} req/s"
    print(f"[{len(done)}/{len(candidates)}] {row.placement.run} {row.placement.describe()}: "
          f"{found}", file=sys.stderr)
  rows = search(candidates, functools.partial(evaluate, sim_cfg, mcfg, trace=trace),
                sustains(sim_cfg), lo=p.rate_lo, hi=p.rate_hi, rel_tol=p.rel_tol,
                on_result=progress, workers=int(p.get("workers", 0)),
                reachable=functools.partial(within_bound, sim_cfg.plan))
  if trace is not None:   # DIR's resampled rows as an in-process search leaves them
    last = next(r for r in rows if r.placement == candidates[-1])
    placement_config(sim_cfg, mcfg, candidates[-1], last.search.tried[-1], trace)
  header = [f"command: `{command}`",
            *plan_output.what_ran(sim_cfg, mcfg, plan_output.workload_text(sim_cfg, trace))]
  print(plan_output.write_outputs(workdir, rows, sim_cfg, header))
  print(f"results: {workdir}")


def entry_point() -> None:
  """Without --config on the command line, the planner plans PLAN_DEFAULT: the flag is
  pdjax.run's (cli.define_config_and_workdir), whose default (the run's configs/default.py)
  ml_collections loads when the flag is defined, reading sys.argv then; so argv names
  PLAN_DEFAULT before the flags are defined."""
  global CONFIG, WORKDIR
  if not any(a.partition("=")[0] in ("--config", "-config") for a in sys.argv[1:]):
    sys.argv[1:1] = [f"--config={PLAN_DEFAULT}"]
  CONFIG, WORKDIR = define_config_and_workdir()
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
