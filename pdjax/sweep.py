"""Runs a config's sweep: every override dict from its `get_sweep()`, one experiment each.

  python -m pdjax.sweep --config=configs/ablate_path.py [--workdir=DIR]

Each point runs like `python -m pdjax.run` with its overrides (into DIR/<index>-<label>/) and
adds one row per run (colocated / chunked / disaggregated) to DIR/sweep.csv and DIR/sweep.md.
Plots: SLO attainment and TTFT/TPOT p99 per point; when the sweep varies `workload.rate`, the
attainment-vs-rate curves and each run's per-chip goodput (DistServe: the highest swept rate
whose attainment >= slo.attainment, divided by the chips the run used).
"""

from __future__ import annotations

import csv
import os
import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax import run as run_lib
from pdjax.cli import fail, use_cpu_devices

COLUMNS = ["point", "label", "run", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
           "slo_attainment", "goodput_rps", "output_tok_s", "finished", "rejected",
           "preemptions", "kv_transfers", "kv_transfer_p99_ms", "chips"]


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


def row_of(point: int, label: str, run: str, s: dict, chips: int) -> dict:
  ms = lambda v: None if v is None else round(1000 * v, 2)
  return {"point": point, "label": label, "run": run,
          "ttft_p50_ms": ms(s["ttft_s"]["p50"]), "ttft_p99_ms": ms(s["ttft_s"]["p99"]),
          "tpot_p50_ms": ms(s["tpot_s"]["p50"]), "tpot_p99_ms": ms(s["tpot_s"]["p99"]),
          "slo_attainment": round(s["slo_attainment"], 4), "goodput_rps": round(s["goodput_rps"], 3),
          "output_tok_s": round(s["output_tok_s"], 1), "finished": s["requests"]["finished"],
          "rejected": s["requests"]["rejected"], "preemptions": s.get("preemptions", 0),
          "kv_transfers": s["kv_transfer"]["count"], "kv_transfer_p99_ms": ms(s["kv_transfer"]["p99_s"]),
          "chips": chips}


def write_tables(workdir: str, rows: list[dict]) -> None:
  with open(os.path.join(workdir, "sweep.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  fmt = lambda v: "-" if v is None else str(v)
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
  with open(os.path.join(workdir, "sweep.md"), "w") as f:
    f.write("# Sweep\n\n" + "\n".join(lines) + "\n")


def write_plots(workdir: str, rows: list[dict], rates: dict[int, float], target: float) -> dict:
  """Bar-style metric plots per point; goodput curves when the sweep varies the rate."""
  from pdjax.metrics import plots
  from pdjax.metrics.goodput import per_chip_goodput
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  plots.plot_sweep_metrics(rows, os.path.join(workdir, "plots", "sweep_metrics.png"))
  goodput = {}
  if rates:
    curves: dict[str, list] = {}
    for r in rows:
      curves.setdefault(r["run"], []).append((rates[r["point"]], r["slo_attainment"]))
    plots.plot_goodput_curves(curves, target, os.path.join(workdir, "plots", "goodput.png"))
    chips = {r["run"]: r["chips"] for r in rows}
    goodput = {run: per_chip_goodput(pts, target, chips[run]) for run, pts in curves.items()}
  return goodput


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
  rows, rates, params_cache = [], {}, {}
  for i, (overrides, cfg, mcfg) in enumerate(zip(sweep, points, mcfgs)):
    label = label_of(overrides)
    print(f"[{i + 1}/{len(points)}] {label}", file=sys.stderr)
    key = (cfg.model.checkpoint, cfg.model.preset, cfg.seed, cfg.model.dtype)
    if key not in params_cache:
      params_cache[key] = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                                      dtype=cfg.model.dtype)
    if "workload.rate" in overrides:
      rates[i] = float(overrides["workload.rate"])
    for run in config_lib.modes(cfg):
      run_dir = os.path.join(workdir, f"{i:02d}-{label}", run)
      summary, _ = run_lib.run_mode(cfg, mcfg, run, run_dir, params_cache[key])
      rows.append(row_of(i, label, run, summary, chips_of(cfg, run)))
    write_tables(workdir, rows)   # after every point: a long sweep leaves partial results
  goodput = write_plots(workdir, rows, rates, base.slo.attainment)
  if goodput:
    with open(os.path.join(workdir, "sweep.md"), "a") as f:
      f.write("\n## Per-chip goodput (highest swept rate with attainment >= "
              f"{base.slo.attainment})\n\n| run | rate (req/s) | chips | per chip |\n|---|---|---|---|\n")
      for run, g in goodput.items():
        f.write(f"| {run} | {g['rate']} | {g['chips']} | "
                f"{'-' if g['per_chip'] is None else round(g['per_chip'], 3)} |\n")
  print(open(os.path.join(workdir, "sweep.md")).read())
  print(f"results: {workdir}")


if __name__ == "__main__":
  app.run(main, flags_parser=run_lib.parse_flags)
