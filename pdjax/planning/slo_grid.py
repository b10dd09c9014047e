"""Per-request latencies once, SLO attainment for any (TTFT, TPOT) target afterwards.

A simulated run depends on (model, hardware, mix, placement, rate), not on the SLO, so the map
records each run's per-request TTFT and TPOT once and evaluates every SLO cell from the
arrays. Attainment is defined exactly as pdjax.metrics.summary's: a request meets the SLO when
it finished, its TTFT <= the target and its TPOT (if defined: output > 1 token) <= the target;
cancelled requests are not judged, rejected and failed ones are misses.

A rate counts only where the run is stable: goodput is a steady-state rate, and a run whose
queues grow for as long as requests arrive has none, whatever its attainment over a short
window (a TPOT target averages a request's wait for a decode slot over its output, so a loose
TPOT hides seconds of backlog from a window of a few seconds). Requests are kept in arrival
order; the run is unstable when the median TTFT or the median TPOT of the last third of
arrivals exceeds STABLE_GROWTH x that of the middle third plus a floor (STABLE_FLOOR_S): a
queue that grows linearly over the window, not the noise of a steady one.

For one cell, a placement's goodput is the highest rate tried that is stable with attainment >=
the target (no interpolation between rates), divided by its chips; each kind's best
(colocated, chunked, disaggregated) and the winner follow. Pure numpy.

A goodput is a capacity only where some rate above it was tried and failed the cell. A
placement that meets the cell at the highest rate its walk reached (the lattice's top, or the
highest whose run fits plan.max_requests_per_run) has a lower bound there, not a capacity
(`bounded`): the kind's best is then a lower bound (Cell.unsaturated names such kinds), and a
cell where any of the three kinds is one is "unsaturated": no winner, no ratio, never a win or
a tie (two kinds at the cap used to read as a tie). slo_headroom's steps against a lower bound
(its own or the best other kind's) are nan: unknown.

Hybrid kinds (plan.map_hybrid): a disaggregated placement whose decode instances may prefill
locally, by a per-request path policy (HYBRID: isl_bounding or slo_headroom). They are scored
beside the three kinds but do not enter `winner` (the map's question stays disaggregated vs
aggregated); `steps` compares slo_headroom with the best of the other four kinds in rate
lattice steps. slo_headroom's path choices read the SLO, so its runs belong to one cell each
(a run entry's `cell`); every other kind's runs answer every cell.

The kind `hybrid` (plan.map_hybrid=instances: TaiChi-style instances that both prefill and
decode, mode=hybrid, map_instances.py) competes with the three fixed kinds on its own columns:
`hybrid_steps` (its best against the best fixed kind, in lattice steps; nan where either is a
lower bound) and `best_kinds` (the kinds, hybrid included, reaching the cell's best rate). It
leaves `winner` as it is (disaggregated vs aggregated). Its runs answer every cell (taichi
steered by the config's SLO) or, per cell, that cell only (taichi steered by the cell's SLO).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

KINDS = ("colocated", "chunked", "disaggregated")
HYBRID = ("isl_bounding", "slo_headroom")
INSTANCES = "hybrid"       # plan.map_hybrid=instances: mode=hybrid placements (taichi)
STABLE_GROWTH = 1.5
STABLE_FLOOR_S = {"ttft": 0.02, "tpot": 0.002}
MIN_STABLE_CHECK = 150     # fewer requests: thirds too small to tell a trend from length noise


@dataclasses.dataclass
class RunRecord:
  """One simulated run: the offered rate (req/s, all chips) and per-request latencies."""
  rate: float
  ttft: np.ndarray      # seconds, in arrival order; inf where no first token came
  tpot: np.ndarray      # seconds; 0 where TPOT is undefined (one output token)
  judged: np.ndarray    # bool; False for cancelled requests

  @classmethod
  def from_requests(cls, rate: float, requests) -> "RunRecord":
    from pdjax.request import Status
    requests = sorted(requests, key=lambda r: r.arrival_s)
    ok = [r.status == Status.FINISHED and r.ttft_s is not None for r in requests]
    ttft = np.array([r.ttft_s if good else math.inf for r, good in zip(requests, ok)])
    tpot = np.array([(r.tpot_s or 0.0) if good else math.inf for r, good in zip(requests, ok)])
    judged = np.array([r.status != Status.CANCELLED for r in requests], dtype=bool)
    return cls(float(rate), ttft.astype(np.float64), tpot.astype(np.float64), judged)

  def attainment(self, ttft_s: float, tpot_s: float) -> float:
    n = int(self.judged.sum())
    if n == 0:
      return 0.0
    good = self.judged & (self.ttft <= ttft_s) & (self.tpot <= tpot_s)
    return int(good.sum()) / n

  @property
  def stable(self) -> bool:
    """No latency trend: see the module docstring."""
    n = len(self.ttft)
    if n < MIN_STABLE_CHECK:
      return True
    _, mid, last = np.array_split(np.arange(n), 3)
    for name, values in (("ttft", self.ttft), ("tpot", self.tpot)):
      before, after = np.median(values[mid]), np.median(values[last])
      if after > STABLE_GROWTH * before + STABLE_FLOOR_S[name]:
        return False
    return True

  def meets(self, ttft_s: float, tpot_s: float, target: float) -> bool:
    """Stable, and attainment >= target at this SLO."""
    return self.stable and self.attainment(ttft_s, tpot_s) >= target


def goodput(records: list[RunRecord], ttft_s: float, tpot_s: float, target: float) -> float:
  """The highest rate among `records` that meets the SLO (RunRecord.meets; 0.0 when none)."""
  passing = [r.rate for r in records if r.meets(ttft_s, tpot_s, target)]
  return max(passing, default=0.0)


def bounded(records: list[RunRecord], ttft_s: float, tpot_s: float, target: float) -> bool:
  """Whether goodput() is a capacity: none meets the SLO, or a rate above the highest that
  meets it was tried and failed it. False: met at the highest rate tried, a lower bound."""
  best = goodput(records, ttft_s, tpot_s, target)
  return best == 0.0 or any(r.rate > best and not r.meets(ttft_s, tpot_s, target)
                            for r in records)


@dataclasses.dataclass
class Cell:
  ttft_s: float
  tpot_s: float
  best: dict            # kind -> (per-chip goodput, placement description or "")
  winner: str           # colocated | chunked | disaggregated | tie | none | unsaturated
  ratio: float          # best disaggregated / best aggregated (nan: neither meets the SLO,
                        # or unsaturated)
  steps: float | None = None   # slo_headroom - best other kind, in lattice steps (None: not run;
                               # +inf: only slo_headroom meets; -inf: only another kind does;
                               # nan: either is a lower bound)
  unsaturated: tuple = ()      # kinds whose best here is a lower bound (bounded() False)
  hybrid_steps: float | None = None   # hybrid instances - best fixed kind, in lattice steps
                                      # (None: not run; inf / -inf / nan as `steps`)
  best_kinds: str = ""         # with hybrid instances: the kinds at the cell's best rate
                               # (";"-joined), none, or unsaturated


def best_of(best: dict, lower: set, kinds) -> str:
  """The kinds (of `kinds`) reaching the best per-chip goodput, ";"-joined: "none" when none
  meets the cell, "unsaturated" when any of them is a lower bound there."""
  if any(k in lower for k in kinds):
    return "unsaturated"
  top = max(best[k][0] for k in kinds)
  return ";".join(k for k in kinds if best[k][0] == top) if top > 0 else "none"


def winner_of(per_chip: dict[str, float]) -> tuple[str, float]:
  """(winner, disaggregated / best aggregated) from each kind's best per-chip goodput.
  tie: disaggregated equals the best aggregated kind; none: no kind meets the SLO; between
  colocated and chunked an exact tie goes to colocated (the simpler placement)."""
  agg = max(per_chip.get("colocated", 0.0), per_chip.get("chunked", 0.0))
  dis = per_chip.get("disaggregated", 0.0)
  ratio = math.nan if agg == dis == 0 else (math.inf if agg == 0 else dis / agg)
  if agg == dis == 0:
    return "none", ratio
  if dis == agg:
    return "tie", ratio
  if dis > agg:
    return "disaggregated", ratio
  return ("colocated" if per_chip.get("colocated", 0.0) >= per_chip.get("chunked", 0.0)
          else "chunked"), ratio


def lattice_steps(mine: float, best_other: float, factor: float) -> float:
  """mine vs best_other (per-chip goodputs on one rate lattice) in lattice steps: 0 when equal
  or both meet nothing; +-inf when only one meets the SLO."""
  if mine == best_other:
    return 0.0
  if best_other == 0 or mine == 0:
    return math.inf if best_other == 0 else -math.inf
  return float(round(math.log(mine / best_other) / math.log(factor)))


def cells(runs: list[tuple], ttft_grid, tpot_grid, target: float,
          factor: float | None = None) -> list[Cell]:
  """Every (TTFT, TPOT) cell (TTFT outer, TPOT inner) from runs given as
  (kind, placement description, chips, records[, cell]); the first placement of a kind wins a
  tie. A run with a cell (ttft_s, tpot_s) answers that cell only. factor: the rate lattice's,
  for Cell.steps where slo_headroom ran."""
  kinds = [*KINDS, *(k for k in (*HYBRID, INSTANCES) if any(r[0] == k for r in runs))]
  out = []
  for ttft_s in ttft_grid:
    for tpot_s in tpot_grid:
      best: dict[str, tuple[float, str]] = {k: (0.0, "") for k in kinds}
      lower: set[str] = set()    # kinds with a placement met at its highest rate tried
      for kind, desc, chips, records, *cell in runs:
        if cell and cell[0] is not None and tuple(cell[0]) != (ttft_s, tpot_s):
          continue
        per_chip = goodput(records, ttft_s, tpot_s, target) / chips
        if per_chip > best[kind][0]:
          best[kind] = (per_chip, desc)
        if not bounded(records, ttft_s, tpot_s, target):
          lower.add(kind)
      unsaturated = tuple(k for k in kinds if k in lower)
      if any(k in lower for k in KINDS):
        winner, ratio = "unsaturated", math.nan
      else:
        winner, ratio = winner_of({k: best[k][0] for k in KINDS})
      steps = None
      if "slo_headroom" in best and factor:
        other = max(v for k, (v, _) in best.items() if k != "slo_headroom")
        steps = (math.nan if lower else      # a lower bound on either side: steps unknown
                 lattice_steps(best["slo_headroom"][0], other, factor))
      here = Cell(float(ttft_s), float(tpot_s), best, winner, ratio, steps, unsaturated)
      if INSTANCES in best and factor:
        fixed = max(best[k][0] for k in KINDS)
        here.hybrid_steps = (math.nan if any(k in lower for k in (*KINDS, INSTANCES)) else
                             lattice_steps(best[INSTANCES][0], fixed, factor))
        here.best_kinds = best_of(best, lower, (*KINDS, INSTANCES))
      out.append(here)
  return out
