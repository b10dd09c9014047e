"""The capacity planner's search, independent of how a placement is evaluated (pure Python).

A placement is a serving run on a set of tiers: disaggregated (n_p prefill instances of TP t_p,
n_d decode instances of TP t_d) or colocated (n instances of TP t, with prefill_first or with
chunked prefill). For every placement within the chip budget that fits in memory, the search
finds the highest request rate whose SLO attainment still meets the target (doubling the rate
until it fails, then bisecting to a relative tolerance, as DistServe's placement search does
with its simulator) and ranks placements by that rate per chip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from pdjax.metrics.goodput import next_rate_to_try


@dataclasses.dataclass(frozen=True)
class Placement:
  run: str                                 # colocated | chunked | disaggregated
  tiers: tuple[tuple[str, int, int], ...]  # (role, instances, tp)

  @property
  def chips(self) -> int:
    return sum(n * tp for _, n, tp in self.tiers)

  def describe(self) -> str:
    return " + ".join(f"{n}x{role[0].upper()}(tp{tp})" if self.run == "disaggregated"
                      else f"{n}xTP{tp}" for role, n, tp in self.tiers)


def placements(chip_budget: int, tp_choices: Iterable[int],
               tp_ok: Callable[[int], bool]) -> list[Placement]:
  """Colocated and chunked: as many instances of each TP as the budget holds (instances are
  independent, so fewer replicas change the total rate, not the rate per chip).
  Disaggregated: every n_p x t_p + n_d x t_d <= budget whose TP degrees divide one another
  (KV moves between them)."""
  tps = sorted({t for t in tp_choices if t <= chip_budget and tp_ok(t)})
  out = []
  for run in ("colocated", "chunked"):
    out += [Placement(run, (("colocated", chip_budget // t, t),)) for t in tps]
  for tp_p in tps:
    for tp_d in tps:
      if tp_p % tp_d and tp_d % tp_p:
        continue
      for n_p in range(1, (chip_budget - tp_d) // tp_p + 1):
        for n_d in range(1, (chip_budget - n_p * tp_p) // tp_d + 1):
          out.append(Placement("disaggregated", (("prefill", n_p, tp_p), ("decode", n_d, tp_d))))
  return out


def max_rate(attainment_at: Callable[[float], float], target: float, lo: float, hi: float,
             rel_tol: float, max_doublings: int = 12) -> tuple[float | None, list]:
  """The highest rate in the searched points whose attainment >= target (None when even `lo`
  fails), and the (rate, attainment) points measured."""
  points: list[tuple[float, float]] = []
  for _ in range(max_doublings + 1):
    while (rate := next_rate_to_try(points, target, lo, hi, rel_tol)) is not None:
      points.append((rate, attainment_at(rate)))
    passing = [r for r, a in points if a >= target]
    if not passing or max(passing) < hi:
      break
    lo, hi = hi, 2 * hi          # hi passed: the answer is higher
  passing = [r for r, a in points if a >= target]
  return (max(passing) if passing else None), sorted(points)


@dataclasses.dataclass
class PlanRow:
  placement: Placement
  rate: float | None                       # req/s meeting the SLO target
  points: list

  @property
  def per_chip(self) -> float:
    return 0.0 if self.rate is None else self.rate / self.placement.chips


def search(candidates: list[Placement], attainment_at: Callable[[Placement, float], float],
           *, target: float, lo: float, hi: float, rel_tol: float,
           on_result: Callable[[PlanRow], None] | None = None) -> list[PlanRow]:
  """Every candidate's goodput, best per-chip goodput first (ties: fewer chips, then the
  order given)."""
  rows = []
  for placement in candidates:
    rate, points = max_rate(lambda r, p=placement: attainment_at(p, r), target, lo, hi, rel_tol)
    rows.append(PlanRow(placement, rate, points))
    if on_result:
      on_result(rows[-1])
  order = {id(r): i for i, r in enumerate(rows)}
  return sorted(rows, key=lambda r: (-r.per_chip, r.placement.chips, order[id(r)]))


def best_by_run(rows: list[PlanRow]) -> dict[str, PlanRow]:
  """The best row of each run kind (rows already ranked)."""
  best: dict[str, PlanRow] = {}
  for row in rows:
    best.setdefault(row.placement.run, row)
  return best
