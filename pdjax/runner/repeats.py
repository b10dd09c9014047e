"""Every run of a config (mode=compare: colocated, chunked, disaggregated), `repeats` times
each, with the repeats' aggregate summary."""

from __future__ import annotations

import json
import os

from pdjax import config as config_lib
from pdjax.runner.instance_pool import pool_scope
from pdjax.runner.parallel_runs import RunTask, run_tasks


def run_repeats(cfg, mcfg, workdir: str, params, ray_cluster=None):
  """Every run of the config (mode=compare: colocated, chunked, disaggregated), `repeats`
  times each with seeds seed .. seed+repeats-1 (workload, sampling and faults; the model's
  weights stay those of `seed`); on the simulator in sim.workers processes
  (runner/parallel_runs.py). Returns ({run: summary}, {run: [RunResult per repeat]}), each
  RunResult its comparison_view (the requests' outcomes, no records); with repeats > 1 a run's
  summary is the aggregate (metrics.compare.aggregate_repeats), written to <run>/summary.json
  beside <run>/repeat-<k>/."""
  from pdjax.metrics.compare import aggregate_repeats
  runs, n = config_lib.modes(cfg), int(cfg.get("repeats", 1))
  seeds = [cfg.seed + k for k in range(n)]
  tasks = []
  for k, seed in enumerate(seeds):     # repeat outside: each seed's workload is loaded once
    rep_cfg = cfg
    if k:
      rep_cfg = cfg.copy_and_resolve_references()
      rep_cfg.seed = seed
    for run in runs:
      run_dir = os.path.join(workdir, run) if len(runs) > 1 else workdir
      if n > 1:
        run_dir = os.path.join(run_dir, f"repeat-{k}")
      tasks.append(RunTask(rep_cfg, mcfg, run, run_dir))
  # one build per placement for every run and repeat (and, in a sweep, every point): released
  # when the command's runs are done
  with pool_scope():
    served = run_tasks(cfg, tasks, params, ray_cluster)
  per_run = {run: [s for t, s in zip(tasks, served) if t.run == run] for run in runs}
  summaries = {}
  for run, done in per_run.items():
    if n == 1:
      summaries[run] = done[0][0]
      continue
    summaries[run] = aggregate_repeats(run, [s for s, _ in done], seeds)
    run_dir = os.path.join(workdir, run) if len(runs) > 1 else workdir
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
      json.dump(summaries[run], f, indent=2)
  return summaries, {run: [r for _, r in done] for run, done in per_run.items()}
