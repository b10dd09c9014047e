"""Per-chip goodput from a rate search, and the next rate for that search to measure.

A point is (rate, attainment): the request rate a run offered and the fraction of its
requests that met the SLO there. The runner loops: measure a rate, then ask
next_rate_to_try for the next one, until it answers None; then per_chip_goodput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Point = tuple[float, float]


def _sorted(points: Sequence[Point]) -> list[Point]:
  return sorted((float(r), float(a)) for r, a in points)


def per_chip_goodput(points: Sequence[Point], target: float, chips: int) -> dict:
  """{"rate": the highest measured rate whose attainment >= target (None if none; taken
  literally, so a passing rate above a failing one still counts), "per_chip": rate / chips
  (None if rate is), "target", "chips", "points": the points sorted by rate}."""
  if chips <= 0:
    raise ValueError(f"chips must be > 0, got {chips}")
  pts = _sorted(points)
  passing = [r for r, a in pts if a >= target]
  rate = max(passing) if passing else None
  return {"rate": rate, "per_chip": None if rate is None else rate / chips,
          "target": target, "chips": chips, "points": pts}


def _measured(pts: Sequence[Point], rate: float) -> float | None:
  """Attainment measured at rate (the last one if measured twice), else None."""
  hits = [a for r, a in pts if math.isclose(r, rate, rel_tol=1e-9, abs_tol=1e-12)]
  return hits[-1] if hits else None


def next_rate_to_try(points: Sequence[Point], target: float, lo: float, hi: float,
                     rel_tol: float) -> float | None:
  """The next rate to measure when searching [lo, hi] for the highest passing rate.

  In order: lo if not yet measured; None if lo fails (nothing passes); hi if not yet
  measured; None if hi passes (the answer is at least hi: widen the range to learn more).
  Otherwise, with a the highest passing rate in [lo, hi] and b the lowest failing rate
  above a: None once b - a <= rel_tol * b, else the midpoint (a + b) / 2. Points outside
  [lo, hi] are ignored.
  """
  if not 0 < lo < hi:
    raise ValueError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
  if rel_tol <= 0:
    raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
  pts = [(r, a) for r, a in _sorted(points) if lo * (1 - 1e-9) <= r <= hi * (1 + 1e-9)]
  at_lo, at_hi = _measured(pts, lo), _measured(pts, hi)
  if at_lo is None:
    return float(lo)
  if at_lo < target:
    return None
  if at_hi is None:
    return float(hi)
  if at_hi >= target:
    return None
  a = max(r for r, att in pts if att >= target)
  b = min(r for r, att in pts if att < target and r > a)
  if b - a <= rel_tol * b:
    return None
  return (a + b) / 2
