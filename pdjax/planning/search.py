"""The capacity planner's search, independent of how a placement is evaluated (pure Python).

A placement is a serving run on a set of tiers: disaggregated (n_p prefill instances of TP t_p,
n_d decode instances of TP t_d) or colocated (n instances of TP t, with prefill_first or with
chunked prefill). For every placement within the chip budget that fits in memory, the search
finds the highest request rate the placement sustains (doubling the rate until it fails, then
bisecting to a relative tolerance, as DistServe's placement search does with its simulator) and
ranks placements by that rate per chip. What "sustains" means is injected (`passes`); the
planner and its map use one rule, pdjax.planning.slo_grid.RunRecord.meets. A search that never
finds a failing rate (every rate up to rate_cap passed) reports no goodput: its best rate is a
lower bound, and ranking by it would rank the cap. So does a search stopped at a rate it may not
run (`reachable`: for the planner, a run within plan.max_requests_per_run requests): that rate
is "not reached" (RateSearch.not_reached).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable

from pdjax.metrics.goodput import next_rate_to_try


@dataclasses.dataclass(frozen=True)
class Placement:
  run: str                                 # colocated | chunked | disaggregated | hybrid
  tiers: tuple[tuple[str, int, int], ...]  # (role, instances, tp)
  path: str = ""     # hybrid: the per-request path policy (isl_bounding | slo_headroom)
  chunks: tuple = ()  # hybrid instances (mode=hybrid): (P-heavy, D-heavy) chunk budgets

  @property
  def mode(self) -> str:
    """The serving run it is: a hybrid placement with chunk budgets is mode=hybrid (tiers
    p_heavy and d_heavy); one with a path is a disaggregated run whose path policy may
    prefill on the decode instance."""
    if self.run == "hybrid":
      return "hybrid" if self.chunks else "disaggregated"
    return self.run

  @property
  def chips(self) -> int:
    return sum(n * tp for _, n, tp in self.tiers)

  def describe(self) -> str:
    text = " + ".join(f"{n}x{role[0].upper()}(tp{tp})" if self.run in ("disaggregated", "hybrid")
                      else f"{n}xTP{tp}" for role, n, tp in self.tiers)
    if self.chunks:
      text += f" chunks {self.chunks[0]}/{self.chunks[1]}"
    return f"{text} {self.path}" if self.path else text


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


MAX_DOUBLINGS = 12   # the search widens [lo, hi] at most this many times: rates up to hi * 2^12


def rate_cap(hi: float, max_doublings: int = MAX_DOUBLINGS) -> float:
  """The highest rate the search tries."""
  return hi * 2 ** max_doublings


@dataclasses.dataclass
class RateSearch:
  rate: float | None        # the highest rate tried that passes (None: even `lo` fails)
  records: list             # what evaluate returned, by rate
  passed: list[bool]        # passes(record) of each record
  saturated: bool           # a failing rate was found above `rate`
  tried: list = dataclasses.field(default_factory=list)   # the rates in the order run
  not_reached: float | None = None   # the rate the search stopped at, not run: not reachable

  @property
  def points(self) -> list[tuple[float, bool]]:
    return [(r.rate, ok) for r, ok in zip(self.records, self.passed)]


def max_rate(evaluate: Callable[[float], object], passes: Callable[[object], bool], lo: float,
             hi: float, rel_tol: float, max_doublings: int = MAX_DOUBLINGS,
             reachable: Callable[[float], bool] | None = None) -> RateSearch:
  """The highest rate that passes: lo, then hi, doubling hi while it passes (at most
  max_doublings times), then bisecting between the highest passing and the lowest failing
  rate to rel_tol. evaluate(rate) returns a record with a `.rate`; passes(record) is the one
  rule of what a rate sustains (for the planner: slo_grid.RunRecord.meets). A search whose
  every rate passed is not saturated: its rate is a lower bound, not a capacity. reachable(rate)
  False: the rate is not run and the search stops there (not_reached; every rate before it
  passed, since a bisection only runs rates below one already run)."""
  records, passed, not_reached = [], [], None
  def points():   # next_rate_to_try's (rate, attainment) points: 1 passes, 0 fails
    return [(r.rate, 1.0 if ok else 0.0) for r, ok in zip(records, passed)]
  for _ in range(max_doublings + 1):
    while (rate := next_rate_to_try(points(), 0.5, lo, hi, rel_tol)) is not None:
      if reachable is not None and not reachable(rate):
        not_reached = rate
        break
      records.append(evaluate(rate))
      passed.append(bool(passes(records[-1])))
    if not_reached is not None:
      break
    good = [r.rate for r, ok in zip(records, passed) if ok]
    if not good or max(good) < hi:
      break
    lo, hi = hi, 2 * hi          # hi passed: the answer is higher
  tried = [r.rate for r in records]
  order = sorted(range(len(records)), key=lambda i: records[i].rate)
  records, passed = [records[i] for i in order], [passed[i] for i in order]
  good = [r.rate for r, ok in zip(records, passed) if ok]
  best = max(good) if good else None
  saturated = any(not ok and r.rate > (best or 0.0) for r, ok in zip(records, passed))
  return RateSearch(best, records, passed, saturated, tried, not_reached)


@dataclasses.dataclass
class PlanRow:
  placement: Placement
  search: RateSearch

  @property
  def rate(self) -> float | None:
    """The placement's goodput (req/s): None when the search found no failing rate above its
    best (unsaturated: a lower bound only) or no passing rate."""
    return self.search.rate if self.search.saturated else None

  @property
  def per_chip(self) -> float | None:
    return None if self.rate is None else self.rate / self.placement.chips


def search(candidates: list[Placement], evaluate: Callable[[Placement, float], object],
           passes: Callable[[object], bool], *, lo: float, hi: float, rel_tol: float,
           max_doublings: int = MAX_DOUBLINGS,
           on_result: Callable[[PlanRow], None] | None = None,
           workers: int = 1,
           reachable: Callable[[float], bool] | None = None) -> list[PlanRow]:
  """Every candidate's rate search; rows with a goodput first, best per-chip goodput first
  (ties: fewer chips, then the order given), then the rows without one in the order given.
  workers != 1: the searches in a process pool (planning/pool.py; evaluate, passes and
  reachable picklable), on_result called in the order given once they are all done.
  reachable(rate): whether a search may run that rate (max_rate)."""
  rows = []
  if workers != 1:
    from pdjax.planning import pool
    jobs = [(p, evaluate, passes, lo, hi, rel_tol, max_doublings, reachable) for p in candidates]
    found = pool.run_in_order(_max_rate_job, jobs, workers)
  for i, placement in enumerate(candidates):
    if workers == 1:
      rows.append(PlanRow(placement, max_rate(lambda r, p=placement: evaluate(p, r), passes,
                                              lo, hi, rel_tol, max_doublings, reachable)))
    else:
      rows.append(PlanRow(placement, found[i]))
    if on_result:
      on_result(rows[-1])
  order = {id(r): i for i, r in enumerate(rows)}
  ranked = sorted((r for r in rows if r.rate is not None),
                  key=lambda r: (-r.per_chip, r.placement.chips, order[id(r)]))
  return ranked + [r for r in rows if r.rate is None]


def _max_rate_job(job) -> RateSearch:
  placement, evaluate, passes, lo, hi, rel_tol, max_doublings, reachable = job
  return max_rate(functools.partial(evaluate, placement), passes, lo, hi, rel_tol,
                  max_doublings, reachable)


def best_by_run(rows: list[PlanRow]) -> dict[str, PlanRow]:
  """The best row with a goodput of each run kind (rows already ranked)."""
  best: dict[str, PlanRow] = {}
  for row in rows:
    if row.rate is not None:
      best.setdefault(row.placement.run, row)
  return best
