"""Capacity planner: the placement with the highest per-chip goodput at the config's SLOs.

  python -m pdjax.plan --config=configs/distserve_repro.py [--workdir=DIR]
  python -m pdjax.plan --config.plan.chip_budget=16 --config.plan.tp_choices="(2,4,8)"

Runs on the simulator (backend=sim, whatever the config says): for every placement within
plan.chip_budget chips of sim.hardware that fits in memory — disaggregated (n_p x TP t_p
prefill + n_d x TP t_d decode), and colocated with prefill_first and with chunked prefill —
it searches the highest request rate (Poisson arrivals of the config's workload,
plan.num_requests requests, more when the rate is high: at least plan.min_duration_s seconds
of arrivals) whose SLO attainment (slo.ttft_s, slo.tpot_s) meets
slo.attainment, and ranks placements by that rate per chip. KV pages per instance come from
the chips' memory left after the weights (plan.mem_util of HBM).

Writes DIR/plan.md and plan.csv (ranked), plots/plan.png, and prints the ranking's top and the
best colocated, chunked and disaggregated placements side by side.

Map mode (plan.map=True): the same placements over a grid of SLOs (plan.map_ttft_s x
plan.map_tpot_s), workload mixes (plan.map_mixes), models (plan.map_models) and hardware
(plan.map_hardware): which kind wins each cell and by how much, as map.csv, map.md and a
phase diagram per model and hardware (pdjax/planning/map_mode.py; default DIR: map-<name>):

  python -m pdjax.plan --config=configs/where_disagg_wins.py
"""

from __future__ import annotations

import csv
import math
import os
import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax import run as run_lib
from pdjax.cli import fail
from pdjax.planning import capacity
from pdjax.planning.search import Placement, PlanRow, best_by_run, placements, search

COLUMNS = ["rank", "run", "placement", "chips", "goodput_rps", "per_chip_rps", "rates_tried"]


def placement_config(cfg, mcfg, p: Placement, rate: float):
  """The sim config of one placement at one rate (None when it does not fit in memory)."""
  from pdjax.sim.hardware import HARDWARE
  new = cfg.copy_and_resolve_references()
  new.backend, new.mode, new.progress = "sim", p.run, False
  if p.run == "chunked":
    new.mode = "colocated"
    new.scheduler.colocated_policy = "chunked_prefill"
  for role, n, tp in p.tiers:
    new.cluster[role].instances, new.cluster[role].tp = n, tp
  if p.run == "disaggregated":   # the unused tier must still validate
    new.cluster.colocated.tp = p.tiers[0][2]
  else:
    new.cluster.prefill.tp = new.cluster.decode.tp = p.tiers[0][2]
  pools = [capacity.pool_pages(mcfg, HARDWARE[cfg.sim.hardware], tp, page_size=cfg.kv.page_size,
                               dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4,
                               mem_util=cfg.plan.mem_util, max_model_len=cfg.kv.max_model_len,
                               max_batch=max(cfg.scheduler.decode_buckets))
           for _, _, tp in p.tiers]
  if None in pools:
    return None
  for (role, _, _), pages in zip(p.tiers, pools):
    new.cluster[role].kv_pages = pages       # each tier's pool from its own chips' memory
  new.kv.pages_per_instance = min(pools)
  new.workload.rate = float(rate)
  # Enough arrivals that the window is long against a request's lifetime at every rate: a
  # fixed count at a high rate ends before queues reach their steady state.
  new.workload.num_requests = max(cfg.plan.num_requests,
                                  math.ceil(rate * cfg.plan.min_duration_s))
  return new


def attainment(cfg, mcfg, p: Placement, rate: float) -> float:
  run_cfg = placement_config(cfg, mcfg, p, rate)
  summary, _, _ = run_lib.execute(run_cfg, mcfg, p.run, None, quiet=True)
  return summary["slo_attainment"]


def fits(cfg, mcfg, p: Placement) -> bool:
  return placement_config(cfg, mcfg, p, 1.0) is not None


def tp_ok(mcfg, tp: int) -> bool:
  return all(n % tp == 0 for n in (mcfg.num_kv_heads, mcfg.num_heads, mcfg.intermediate_size))


def write_outputs(workdir: str, rows: list[PlanRow], cfg) -> str:
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  table = [{"rank": i + 1, "run": r.placement.run, "placement": r.placement.describe(),
            "chips": r.placement.chips,
            "goodput_rps": None if r.rate is None else round(r.rate, 3),
            "per_chip_rps": round(r.per_chip, 4), "rates_tried": len(r.points)}
           for i, r in enumerate(rows)]
  with open(os.path.join(workdir, "plan.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(table)
  best = best_by_run(rows)
  summary = comparison_lines(best)
  lines = [f"# Placement plan: {cfg.plan.chip_budget} x {cfg.sim.hardware}, "
           f"SLO TTFT {cfg.slo.ttft_s} s / TPOT {cfg.slo.tpot_s} s at "
           f"{100 * cfg.slo.attainment:.0f}% attainment", "", *summary, "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  lines += ["| " + " | ".join("-" if v is None else str(v) for v in row.values()) + " |"
            for row in table]
  with open(os.path.join(workdir, "plan.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  from pdjax.metrics.plots import plot_plan
  plot_plan([(t["placement"], t["run"], t["per_chip_rps"]) for t in table],
            os.path.join(workdir, "plots", "plan.png"))
  return "\n".join(summary)


def comparison_lines(best: dict[str, PlanRow]) -> list[str]:
  lines = []
  for run in ("disaggregated", "colocated", "chunked"):
    if run in best:
      r = best[run]
      lines.append(f"- best {run}: {r.placement.describe()} ({r.placement.chips} chips): "
                   f"{r.per_chip:.3f} req/s per chip")
  d = best.get("disaggregated")
  for run in ("colocated", "chunked"):
    if d and run in best and best[run].per_chip > 0:
      lines.append(f"- disaggregated / {run}: {d.per_chip / best[run].per_chip:.2f}x "
                   f"per-chip goodput")
  return lines


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  cfg = run_lib.CONFIG.value
  try:
    sim_cfg = cfg.copy_and_resolve_references()
    sim_cfg.backend = "sim"
    mcfg = config_lib.validate(sim_cfg)
    p = cfg.plan
    if p.min_duration_s < 0:
      raise config_lib.ConfigError(f"plan.min_duration_s={p.min_duration_s} must be >= 0")
    if p.chip_budget < 2 or p.num_requests < 1 or not 0 < p.rate_lo < p.rate_hi:
      raise config_lib.ConfigError(
          f"plan.chip_budget={p.chip_budget} (>= 2), plan.num_requests={p.num_requests} "
          f"(>= 1), plan.rate_lo={p.rate_lo} < plan.rate_hi={p.rate_hi} (> 0) required")
    if p.get("map", False):
      from pdjax.planning import map_mode
      map_mode.settings(cfg)
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  default = run_lib.default_workdir(flags.FLAGS["config"].config_filename)
  prefix = "map-" if p.get("map", False) else "plan-"
  workdir = run_lib.WORKDIR.value or os.path.join(os.path.dirname(default),
                                                  prefix + os.path.basename(default))
  if p.get("map", False):
    try:
      command = " ".join(["python -m pdjax.plan", *sys.argv[1:]])
      print(map_mode.run_map(cfg, workdir, command=command))
    except config_lib.ConfigError as e:
      fail(f"config error: {e}")
    print(f"results: {workdir}")
    return
  candidates = [c for c in placements(p.chip_budget, p.tp_choices, lambda t: tp_ok(mcfg, t))
                if fits(sim_cfg, mcfg, c)]
  if not candidates:
    fail(f"config error: no placement of {p.tp_choices} on {p.chip_budget} x "
         f"{cfg.sim.hardware} holds the model and one {cfg.kv.max_model_len}-token sequence")
  print(f"searching {len(candidates)} placements", file=sys.stderr)
  done = []
  def progress(row: PlanRow) -> None:
    done.append(row)
    print(f"[{len(done)}/{len(candidates)}] {row.placement.run} {row.placement.describe()}: "
          f"{row.per_chip:.3f} req/s/chip", file=sys.stderr)
  rows = search(candidates, lambda c, r: attainment(sim_cfg, mcfg, c, r),
                target=cfg.slo.attainment, lo=p.rate_lo, hi=p.rate_hi, rel_tol=p.rel_tol,
                on_result=progress)
  print(write_outputs(workdir, rows, cfg))
  print(f"results: {workdir}")


if __name__ == "__main__":
  app.run(main, flags_parser=run_lib.parse_flags)
