"""Runs a config's sweep: every override dict from its `get_sweep()`, one experiment each.

  python -m pdjax.sweep --config=configs/ablate_path.py [--workdir=DIR]

Each point runs like `python -m pdjax.run` with its overrides, `repeats` times (seeds seed ..
seed+repeats-1, the same for every point), into DIR/<index>-<label>/<run>/ (with repeats:
<run>/repeat-<k>/ and <run>/summary.json, the repeats' aggregate), and adds one row per run
(colocated / chunked / disaggregated) to DIR/sweep.csv and DIR/sweep.md: the mean and the
95% half-width (`<column>_hw`) of each headline metric, and a "Differences" section naming
the points that differ beyond the noise (pdjax/metrics/sweep_tables.py).
Plots: SLO attainment and TTFT/TPOT p99 per point; when the sweep varies `workload.rate`, the
attainment-vs-rate curves and each run's per-chip goodput (DistServe: the highest swept rate
whose mean attainment >= slo.attainment, divided by the chips the run used).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax.cli import define_config_and_workdir, fail, parse_flags, use_cpu_devices
from pdjax.metrics.sweep_tables import differences, row_of, write_tables
from pdjax.runner.outputs import default_workdir
from pdjax.runner.instance_pool import pool_scope
from pdjax.runner.sweep_points import (apply_overrides, chips_of, folder_of, label_of, load_sweep,
                                       point_names, run_point, tiny_warning, write_plots)

CONFIG, WORKDIR = define_config_and_workdir()   # as pdjax.run's


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  base = CONFIG.value
  config_path = flags.FLAGS["config"].config_filename
  try:
    sweep = load_sweep(config_path)
    points = [apply_overrides(base, o) for o in sweep]
    mcfgs = [config_lib.validate(c) for c in points]
    use_cpu_devices(base.num_cpu_devices)
    import jax
    for c in points:
      config_lib.validate(c, device_count=jax.device_count())
  except (config_lib.ConfigError, ValueError) as e:
    fail(f"config error: {e}")
  from pdjax.engine.cluster import enable_compile_cache, host_params
  enable_compile_cache(base.compile_cache_dir)
  workdir = WORKDIR.value or default_workdir(config_path)
  os.makedirs(workdir, exist_ok=True)
  if (warning := tiny_warning(points, mcfgs)):
    print(warning, file=sys.stderr)
  rows, rates, others, params_cache, by_point = [], {}, {}, {}, []
  names = point_names(sweep)
  with pool_scope():   # points on one placement share its instances (instance_pool.py)
    for i, (overrides, cfg, mcfg) in enumerate(zip(sweep, points, mcfgs)):
      label = label_of(overrides)
      print(f"[{i + 1}/{len(points)}] {label}", file=sys.stderr)
      params = None
      if cfg.backend != "sim":   # the simulator needs no weights
        key = (cfg.model.checkpoint, cfg.model.preset, cfg.seed, cfg.model.dtype)
        if key not in params_cache:
          params_cache[key] = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                                          dtype=cfg.model.dtype)
        params = params_cache[key]
      if "workload.rate" in overrides:
        rates[i] = float(overrides["workload.rate"])
        others[i] = label_of({k: v for k, v in overrides.items() if k != "workload.rate"})
      summaries = run_point(cfg, mcfg, os.path.join(workdir, folder_of(i, label)), params)
      by_point.append((names[i], summaries))
      rows += [row_of(i, label, run, s, chips_of(cfg, run)) for run, s in summaries.items()]
      write_tables(workdir, rows)   # after every point: a long sweep leaves partial results
  write_tables(workdir, rows, differences(by_point))
  goodput = write_plots(workdir, rows, rates, base.slo.attainment,
                        {i: o for i, o in others.items() if o != "base"})
  if goodput:
    with open(os.path.join(workdir, "sweep.md"), "a") as f:
      f.write("\n## Per-chip goodput (highest swept rate with mean attainment >= "
              f"{base.slo.attainment})\n\n| run | rate (req/s) | chips | per chip |\n"
              "|---|---|---|---|\n")
      for run, g in goodput.items():
        f.write(f"| {run} | {g['rate']} | {g['chips']} | "
                f"{'-' if g['per_chip'] is None else round(g['per_chip'], 3)} |\n")
  print(open(os.path.join(workdir, "sweep.md")).read())
  print(f"results: {workdir}")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
