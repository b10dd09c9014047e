"""The map's walks (map_search.walk), one per (model, hardware, mix, placement): in-process, or
in a process pool of plan.workers processes (planning/pool.py; 0: one per core).

A walk's runs depend only on its own config, placement and rates (each run is seeded by the
config), never on another walk, so the walks run in any order and in any process. Results are
collected in the map's order (models, hardware, mixes, placements), not by completion: runs.csv,
runs.npz and every cell come out the same whatever the pool size. In a pool each process
writes a trace's resampled rows in its own folder; DIR/workload_resampled.jsonl is written
afterwards as the last run in the map's order leaves it in-process.

A walk runs no rate whose run would need more than plan.max_requests_per_run requests
(placement_runs.within_bound): its climb stops below it ("not reached", logged), and the cells
it still met at its last rate are unsaturated.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from pdjax.planning import placement_runs, pool
from pdjax.planning.map_search import Lattice, loosest_answer, walk
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import RunRecord


@dataclasses.dataclass
class WalkTask:
  key: tuple                 # (model, hardware, mix)
  cfg: object                # the combo's sim config (map_mode.combo)
  mcfg: object
  trace: object              # workload_mix.TraceLengths or None
  placement: Placement
  lattice: Lattice
  start: int
  slo_cells: list
  target: float
  cell: tuple | None = None  # (ttft_s, tpot_s): the one SLO cell the runs answer (slo_headroom)


@dataclasses.dataclass
class Run:
  per_chip: float
  rate: float
  record: RunRecord
  wall_s: float


def _log(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def run_walk(task: WalkTask) -> tuple[list[Run], dict[int, RunRecord]]:
  """One placement's walk: its runs in the order run, and its records by lattice index."""
  pl, runs = task.placement, []
  def evaluate(per_chip: float) -> RunRecord:
    rate = per_chip * pl.chips
    t = time.time()
    rec = placement_runs.evaluate(task.cfg, task.mcfg, pl, rate, task.trace)
    runs.append(Run(per_chip, rate, rec, round(time.time() - t, 2)))
    _log(f"    {pl.describe()} at {per_chip:.3g} req/s/chip: {len(rec.ttft)} requests, "
         f"loosest-SLO attainment {round(rec.attainment(*task.slo_cells[-1]), 4):.3f} "
         f"({runs[-1].wall_s:.1f} s)")
    return rec
  top = reachable_top(task)
  records = walk(evaluate, task.lattice, task.start, task.slo_cells, task.target, top)
  best = loosest_answer(records, task.slo_cells, task.target)
  rate = "none" if best is None else f"{task.lattice.rate(best):.3g}"
  stop = ""
  if best is not None and best == top < task.lattice.k_max:
    stop = (f"; {task.lattice.rate(top + 1):.3g} req/s/chip not reached: "
            + placement_runs.not_reached_text(task.cfg.plan, task.lattice.rate(top + 1)
                                              * pl.chips))
  _log(f"  {pl.run} {pl.describe()}: {len(records)} rates, loosest SLO met up to "
       f"{rate} req/s/chip{stop}")
  return runs, records


def reachable_top(task: WalkTask) -> int:
  """The highest lattice index whose run fits plan.max_requests_per_run (-1: none does)."""
  lat, chips = task.lattice, task.placement.chips
  k = lat.k_max
  while k >= 0 and not placement_runs.within_bound(task.cfg.plan, lat.rate(k) * chips):
    k -= 1
  return k


def run_walks(tasks: list[WalkTask], workers: int) -> list[tuple[list[Run], dict]]:
  """Every task's run_walk result, in the tasks' order (pool.run_in_order)."""
  results = pool.run_in_order(run_walk, tasks, workers, "walks")
  traced = [i for i, t in enumerate(tasks) if t.trace is not None]
  if traced:   # DIR's resampled rows as the in-process map leaves them (its last trace run)
    t, last = tasks[traced[-1]], results[traced[-1]][0][-1]
    placement_runs.placement_config(t.cfg, t.mcfg, t.placement, last.rate, t.trace)
  return results
