"""A sweep's points (`pdjax.sweep`): the override dicts of a config's get_sweep(), applied to
the base config, labelled and named; each point's runs (runner.repeats); and the sweep's plots
(per-point metrics, and goodput curves when the sweep varies workload.rate)."""

from __future__ import annotations

import os

from pdjax import config as config_lib
from pdjax.runner.repeats import run_repeats


def load_sweep(config_path: str) -> list[dict]:
  path = config_path.split(":")[0]
  module = config_lib.load_config_module(path)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep()")
  return list(module.get_sweep())


# Config dicts whose keys are the user's own: a point may add one (a point that names the
# user's policy also sets its arguments: "scheduler.policy_args.index"; the built-in points'
# configs keep none, as config validation wants).
FREE_FORM = ("scheduler.policy_args",)


def apply_overrides(cfg, overrides: dict):
  """A copy of cfg with dotted-key overrides; an unknown key is a one-line error (a new key
  of a FREE_FORM dict is not unknown)."""
  new = cfg.copy_and_resolve_references()
  for key, value in overrides.items():
    node = new
    parts = key.split(".")
    for part in parts[:-1]:
      if part not in node:
        raise config_lib.ConfigError(f"sweep override {key!r}: unknown config key")
      node = node[part]
    if parts[-1] not in node:
      if ".".join(parts[:-1]) not in FREE_FORM:
        raise config_lib.ConfigError(f"sweep override {key!r}: unknown config key")
      with node.unlocked():
        node[parts[-1]] = value
      continue
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
  """A point's folder (and its name in sweep.md's differences when its name repeats): its
  label, a path separator in it (a value that is a file: sim.hardware=chips/my_chip.json)
  as "_", so that each point is one folder; ':' (an import path) and '=' stay."""
  for sep in {os.sep, os.altsep or os.sep, "/"}:
    label = label.replace(sep, "_")
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
  """Every run of one point, `repeats` times each (runner.repeats.run_repeats); {run: summary or
  aggregate}. A point of one run writes into <point>/<run>/ as a point of several does."""
  runs = config_lib.modes(cfg)
  workdir = point_dir if len(runs) > 1 else os.path.join(point_dir, runs[0])
  summaries, _ = run_repeats(cfg, mcfg, workdir, params)
  return summaries
