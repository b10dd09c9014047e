"""Which placements and which rates the map simulates (pure Python, evaluation injected).

Rates lie on a geometric lattice of per-chip rates, rate_k = rate_min * factor**k for
k = 0..k_max (rate_k <= rate_max). For one placement the walk starts at a lattice point and
  - climbs while the loosest SLO cell (largest TTFT and TPOT targets, the one a higher rate
    passes longest) is still met (RunRecord.meets: stable, attainment >= the target),
    stopping at the first rate that fails;
  - then descends below the start until every cell is met by some rate tried (a lower rate
    cannot change a met cell's answer, its highest meeting rate), or until a lower rate
    improves no unmet cell's attainment by more than IMPROVED over the rate above it (those
    cells are at their unloaded floor: lower rates would not make them pass), or rate_min;
    while the loosest cell fails, the start was above capacity and the descent goes on
    regardless.
Every cell's goodput is then the highest rate tried that meets it (slo_grid.goodput). A cell
whose answer lies between two lattice points reads the lower one: the map's resolution is the
lattice factor. The climb also stops at `top`, the highest lattice index whose run fits
plan.max_requests_per_run (map_walks): a cell met there, as one met at k_max, has a lower bound
(slo_grid.bounded: the cell is unsaturated).

Cost: a run simulates every token of every request it offers (an overloaded placement still
serves them all), so a run costs about rate x window x output length whatever the placement,
and a walk about factor / (1 - 1 / factor) times its highest rate's run (4.8 at sqrt 2),
wherever it starts: starting low (plan.map_rate_start) costs a few cheap runs; starting far
above a placement's capacity costs several expensive ones. Every walk starts at the same low
point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pdjax.planning.search import Placement, placements
from pdjax.planning.slo_grid import RunRecord


IMPROVED = 0.01   # attainment gain that keeps the walk descending


class Lattice:
  def __init__(self, rate_min: float, rate_max: float, factor: float):
    self.rate_min, self.factor = float(rate_min), float(factor)
    self.k_max = int(math.floor(math.log(rate_max / rate_min) / math.log(factor) + 1e-9))

  def rate(self, k: int) -> float:
    return self.rate_min * self.factor ** k

  def nearest(self, rate: float) -> int:
    k = round(math.log(max(rate, self.rate_min) / self.rate_min) / math.log(self.factor))
    return min(max(k, 0), self.k_max)


def walk(evaluate: Callable[[float], RunRecord], lattice: Lattice, start: int,
         slo_cells: Sequence[tuple[float, float]], target: float,
         top: int | None = None) -> dict[int, RunRecord]:
  """The records of the rates the walk tries, by lattice index (evaluate takes a per-chip
  rate). slo_cells: every (ttft_s, tpot_s) of the grid. top: the highest index it may run
  (None: k_max)."""
  loosest = (max(t for t, _ in slo_cells), max(p for _, p in slo_cells))
  records: dict[int, RunRecord] = {}
  top = lattice.k_max if top is None else min(top, lattice.k_max)
  start = min(max(start, 0), top)
  k = start
  while k <= top:
    records[k] = evaluate(lattice.rate(k))
    if not records[k].meets(*loosest, target):
      break
    k += 1
  above = records[start]
  for k in range(start - 1, -1, -1):
    # A lower rate changes only the answer of a cell no rate tried meets yet: a cell's
    # goodput is the highest rate meeting it (slo_grid.goodput).
    unmet = [c for c in slo_cells if not any(r.meets(*c, target) for r in records.values())]
    if not unmet:
      break
    records[k] = now = evaluate(lattice.rate(k))
    if now.meets(*loosest, target) and not any(
        now.attainment(*c) > above.attainment(*c) + IMPROVED
        for c in unmet if not now.meets(*c, target)):
      break
    above = now
  return records


def loosest_answer(records: dict[int, RunRecord], slo_cells, target: float) -> int | None:
  """The highest lattice index whose run meets the loosest cell (None when none does)."""
  loosest = (max(t for t, _ in slo_cells), max(p for _, p in slo_cells))
  ok = [k for k, r in records.items() if r.meets(*loosest, target)]
  return max(ok, default=None)


def map_placements(chip_budget: int, tp_choices: Sequence[int], tp_ok: Callable[[int], bool],
                   fits: Callable[[Placement], bool], *, tp_count: int, full_budget: bool,
                   max_disagg: int) -> list[Placement]:
  """The map's candidates: search.placements' enumeration restricted to the tp_count smallest
  TP degrees that fit (`fits` on a colocated placement of that degree), to placements using
  the whole budget when full_budget, and, when max_disagg > 0, to one disaggregated placement
  per number of prefill chips (the first enumerated: smallest TP degrees), at most max_disagg
  of them evenly spaced from the fewest prefill chips to the most (0: every one)."""
  fitting = sorted(t for t in set(tp_choices)
                   if t <= chip_budget and tp_ok(t)
                   and fits(Placement("colocated", (("colocated", chip_budget // t, t),))))
  tps = fitting[:tp_count]
  out = [p for p in placements(chip_budget, tps, tp_ok)
         if (not full_budget or p.chips == chip_budget) and fits(p)]
  agg = [p for p in out if p.run != "disaggregated"]
  by_share: dict[int, Placement] = {}      # prefill chips -> the first such placement
  for p in out:
    if p.run == "disaggregated":
      by_share.setdefault(p.tiers[0][1] * p.tiers[0][2], p)
  dis = [by_share[k] for k in sorted(by_share)] if max_disagg else \
      [p for p in out if p.run == "disaggregated"]
  if max_disagg and len(dis) > max_disagg:
    step = (len(dis) - 1) / max(max_disagg - 1, 1)
    dis = [dis[round(i * step)] for i in range(max_disagg)]
  return agg + dis
