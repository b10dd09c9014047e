"""The plain planner's files and printed summary: what ran, the ranking, and why a row has no
number (plan.csv, plan.md, plots/plan.png). Host code, no jax; matplotlib only to draw.

A row has a goodput only when its search found a failing rate above its best passing one
(search.PlanRow.rate). The others are listed, never ranked, and no ratio is computed from them:
  unsaturated  every rate up to the search's cap passed, so the best rate is the cap, not a
               capacity (the `tiny` preset on a data-center chip, or windows too short for a
               queue to grow in);
  not reached  every rate run passed, and the next would need more requests than
               plan.max_requests_per_run (search.RateSearch.not_reached): a lower bound too;
  lo fails     even plan.rate_lo failed.
"""

from __future__ import annotations

import csv
import os

from pdjax.metrics import run_info as info_lib
from pdjax.planning import slo_grid
from pdjax.planning.placement_runs import not_reached_text
from pdjax.planning.search import PlanRow, best_by_run, rate_cap

COLUMNS = ["rank", "run", "placement", "chips", "goodput_rps", "per_chip_rps", "saturated",
           "rates_tried"]


def what_ran(cfg, mcfg, workload: str) -> list[str]:
  """The lines naming the runs: backend, model, workload (as the planner offers it), SLO,
  seed."""
  slo = {"ttft_s": float(cfg.slo.ttft_s), "tpot_s": float(cfg.slo.tpot_s),
         "attainment": float(cfg.slo.attainment)}
  return [f"backend: {info_lib.describe_backend(info_lib.backend_info(cfg))}",
          f"model: {info_lib.describe_model(info_lib.model_info(cfg, mcfg))}",
          f"workload: {workload}", f"SLO: {info_lib.describe_slo(slo)}", f"seed: {cfg.seed}"]


def workload_text(cfg, trace=None, rates: str = "the searched rates") -> str:
  """How the planner offers cfg's workload: its kind and preset (or trace), arrivals at the
  planner's rates, and each run's window."""
  w, p = cfg.workload, cfg.plan
  if trace is not None:
    what = trace.describe()
  else:
    what = f"{w.kind} {w.preset}, {w.arrival} arrivals"
  return (f"{what} at {rates}; each rate >= {p.num_requests} requests and >= "
          f"{p.min_duration_s:g} s of arrivals")


def rule_line(cfg) -> str:
  return (f"a placement sustains a rate when >= {100 * cfg.slo.attainment:g}% of requests meet "
          f"the SLO and its latencies do not grow over the run (median TTFT and TPOT of the "
          f"last third of arrivals <= {slo_grid.STABLE_GROWTH:g}x the middle third's + "
          f"{slo_grid.STABLE_FLOOR_S['ttft'] * 1e3:g} / {slo_grid.STABLE_FLOOR_S['tpot'] * 1e3:g}"
          f" ms)")


def reason(row: PlanRow, cfg) -> str | None:
  """Why a row has no goodput (None when it has one)."""
  if row.rate is not None:
    return None
  if row.search.not_reached is not None:
    return (f"not reached: {not_reached_text(cfg.plan, row.search.not_reached)} (every rate up "
            f"to {row.search.rate:g} req/s passed): raise plan.max_requests_per_run or lower "
            f"plan.min_duration_s")
  if row.search.rate is None:
    return (f"fails at the lowest rate tried, plan.rate_lo={cfg.plan.rate_lo:g} req/s: lower "
            f"plan.rate_lo")
  return (f"no rate up to {rate_cap(cfg.plan.rate_hi):g} req/s failed: the model is too small "
          f"for this hardware (or each rate's window too short for a queue to grow: "
          f"plan.min_duration_s), raise plan.rate_hi or use a published shape")


def comparison_lines(rows: list[PlanRow], cfg) -> list[str]:
  """The best of each kind, disaggregated / each aggregated kind (rows with a goodput only),
  and one line per reason some rows have none."""
  best = best_by_run(rows)
  lines = []
  for run in ("disaggregated", "colocated", "chunked"):
    if run in best:
      r = best[run]
      lines.append(f"- best {run}: {r.placement.describe()} ({r.placement.chips} chips): "
                   f"{r.per_chip:.3f} req/s per chip")
  d = best.get("disaggregated")
  for run in ("colocated", "chunked"):
    if d and run in best:
      lines.append(f"- disaggregated / {run}: {d.per_chip / best[run].per_chip:.2f}x "
                   f"per-chip goodput")
  reasons: dict[str, int] = {}
  for row in rows:
    if (why := reason(row, cfg)) is not None:
      reasons[why] = reasons.get(why, 0) + 1
  for why, n in reasons.items():
    lines.append(f"- {n} of {len(rows)} placements have no goodput: {why}")
  return lines


def table(rows: list[PlanRow]) -> list[dict]:
  out, rank = [], 0
  for r in rows:
    rank += r.rate is not None
    out.append({"rank": rank if r.rate is not None else None, "run": r.placement.run,
                "placement": r.placement.describe(), "chips": r.placement.chips,
                "goodput_rps": None if r.rate is None else round(r.rate, 3),
                "per_chip_rps": None if r.rate is None else round(r.per_chip, 4),
                "saturated": "true" if r.search.saturated else "false",
                "rates_tried": len(r.search.records)})
  return out


def write_outputs(workdir: str, rows: list[PlanRow], cfg, header: list[str]) -> str:
  """plan.csv, plan.md and plots/plan.png; returns the printed summary."""
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  t = table(rows)
  with open(os.path.join(workdir, "plan.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(t)
  summary = comparison_lines(rows, cfg)
  lines = [f"# Placement plan: {cfg.plan.chip_budget} x {cfg.sim.hardware}, "
           f"SLO TTFT {cfg.slo.ttft_s} s / TPOT {cfg.slo.tpot_s} s at "
           f"{100 * cfg.slo.attainment:.0f}% attainment", "",
           *[f"- {line}" for line in header], f"- rule: {rule_line(cfg)}", "",
           "## Ranking", "", *summary, "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  lines += ["| " + " | ".join("-" if v is None else str(v) for v in row.values()) + " |"
            for row in t]
  with open(os.path.join(workdir, "plan.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  from pdjax.metrics.plots import plot_plan
  plot_plan([(r["placement"], r["run"], r["per_chip_rps"]) for r in t
             if r["per_chip_rps"] is not None], os.path.join(workdir, "plots", "plan.png"))
  return "\n".join([*header, *summary])
