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
from pdjax import run as run_lib
from pdjax.cli import fail, use_cpu_devices
from pdjax.metrics.sweep_tables import differences, row_of, write_tables


def load_sweep(config_path: str) -> list[dict]:
  path = config_path.split(":")[0]
  module = config_lib.load_config_module(path)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep()")
  return list(module.get_sweep())


def apply_overrides(cfg, overrides: dict):
  """A copy of cfg with dotted-key overrides; an unknown key is a one-line error."""
  new = cfg.copy_and_resolve_references()
  for key, value in overrides.items():
    node = new
    parts = key.split(".")
    for part in parts[:-1]:
      if part not in node:
        raise config_lib.ConfigError(f"sweep override {key!r}: unknown config key")
      node = node[part]
    if parts[-1] not in node:
      raise config_lib.ConfigError(f"sweep override {key!r}: unknown config key")
    node[parts[-1]] = value
  return new


def label_of(overrides: dict) -> str:
  return ",".join(f"{'.'.join(k.split('.')[-2:])}={v}" for k, v in overrides.items()) or "base"


def chips_of(cfg, run: str) -> int:
  return sum(n * tp for _, n, tp in config_lib.tiers(cfg)[config_lib.RUNS[run]])


def write_plots(workdir: str, rows: list[dict], rates: dict[int, float], target: float,
                others: dict[int, str] | None = None) -> dict:
  """Bar-style metric plots per point; goodput curves (of the mean attainment) when the sweep
  varies the rate: one per run, and per value of the other overrides (others: {point: their
  label}) when a point sets more than the rate."""
  from pdjax.metrics import plots
  from pdjax.metrics.goodput import per_chip_goodput
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  plots.plot_sweep_metrics(rows, os.path.join(workdir, "plots", "sweep_metrics.png"))
  goodput = {}
  if rates:
    curves: dict[str, list] = {}
    chips: dict[str, int] = {}
    for r in rows:
      other = (others or {}).get(r["point"], "")
      curve = f"{r['run']} {other}" if other else r["run"]
      curves.setdefault(curve, []).append((rates[r["point"]], r["slo_attainment"]))
      chips[curve] = r["chips"]
    if any(len(pts) > 1 for pts in curves.values()):   # else no curve to read a goodput off
      plots.plot_goodput_curves(curves, target, os.path.join(workdir, "plots", "goodput.png"))
      goodput = {c: per_chip_goodput(pts, target, chips[c]) for c, pts in curves.items()}
  return goodput


def folder_of(index: int, label: str) -> str:
  """A point's folder (and its name in sweep.md's differences when its name repeats)."""
  return f"{index:02d}-{label}"


def point_names(sweep: list[dict]) -> list[str]:
  """The points' names in sweep.md's differences: their overrides by each key's last part
  (its last two where two keys of the sweep share the last part); the folder's name where two
  points would share a name."""
  keys = list(dict.fromkeys(k for o in sweep for k in o))
  last = [k.split(".")[-1] for k in keys]
  short = {k: k.split(".")[-1] if last.count(k.split(".")[-1]) == 1
           else ".".join(k.split(".")[-2:]) for k in keys}
  names = [",".join(f"{short[k]}={v}" for k, v in o.items()) or "base" for o in sweep]
  return [n if names.count(n) == 1 else folder_of(i, label_of(o))
          for i, (n, o) in enumerate(zip(names, sweep))]


def tiny_warning(points, mcfgs) -> str | None:
  """The tiny-preset warning when any point simulates the toy model (printed once)."""
  from pdjax.metrics.run_info import run_info, tiny_sim_warning
  for cfg, mcfg in zip(points, mcfgs):
    if (warning := tiny_sim_warning(run_info(cfg, mcfg, cfg.mode, []))):
      return warning
  return None


def run_point(cfg, mcfg, point_dir: str, params) -> dict[str, dict]:
  """Every run of one point, `repeats` times each (run.run_repeats); {run: summary or
  aggregate}. A point of one run writes into <point>/<run>/ as a point of several does."""
  runs = config_lib.modes(cfg)
  workdir = point_dir if len(runs) > 1 else os.path.join(point_dir, runs[0])
  summaries, _ = run_lib.run_repeats(cfg, mcfg, workdir, params)
  return summaries


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  base = run_lib.CONFIG.value
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
  workdir = run_lib.WORKDIR.value or run_lib.default_workdir(config_path)
  os.makedirs(workdir, exist_ok=True)
  if (warning := tiny_warning(points, mcfgs)):
    print(warning, file=sys.stderr)
  rows, rates, others, params_cache, by_point = [], {}, {}, {}, []
  names = point_names(sweep)
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


if __name__ == "__main__":
  app.run(main, flags_parser=run_lib.parse_flags)
