"""Means with 95% confidence intervals over repeats, and when two of them differ (pure Python).

A run on a shared machine (or a seeded workload drawn again) gives a different number each
time; one run's number carries no noise estimate. With `repeats` = N, each mode runs N times
with seeds seed .. seed+N-1 and every table metric is reported as mean ± half-width of its
95% interval, Student's t with N - 1 degrees of freedom:

  half_width = t_{0.975, N-1} * stdev(values) / sqrt(N)     (None when N < 2)

Two modes differ "beyond the noise" on a metric only when their intervals do not overlap
(a conservative test: overlapping 95% intervals can still differ at 95%, never the other way).

Several comparisons judged together (metrics.compare's conclusion: every pair of the modes a
line ranks) take p-values (t_two_sided_p: Student's t, exact for integer degrees of freedom;
overlap_p: the level at which two intervals stop overlapping) and Holm's step-down correction
(holm), which holds the chance of any false difference among them to 5%.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
  """t_{0.975, df}: the table up to 30, then the Cornish-Fisher expansion around 1.96."""
  if df < 1:
    raise ValueError(f"degrees of freedom must be >= 1, got {df}")
  if df <= len(_T975):
    return _T975[df - 1]
  z = 1.959964
  return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def interval(values: Sequence[float | None]) -> dict:
  """{"n", "mean", "half_width", "lo", "hi", "values"} of the values that are not None
  (mean None when none is; half_width, lo and hi None when fewer than two)."""
  kept = [float(v) for v in values if v is not None]
  n = len(kept)
  mean = statistics.fmean(kept) if n else None
  hw = t975(n - 1) * statistics.stdev(kept) / math.sqrt(n) if n >= 2 else None
  return {"n": n, "mean": mean, "half_width": hw,
          "lo": None if hw is None else mean - hw, "hi": None if hw is None else mean + hw,
          "values": [None if v is None else float(v) for v in values]}


def differ(a: dict, b: dict) -> bool | None:
  """Whether two intervals (interval()) do not overlap; None when either has no interval."""
  if a["half_width"] is None or b["half_width"] is None:
    return None
  return a["hi"] < b["lo"] or b["hi"] < a["lo"]



def t_two_sided_p(t: float, df: int) -> float:
  """P(|T| >= |t|) for Student's t with df (an integer >= 1) degrees of freedom: the closed
  forms of Abramowitz & Stegun 26.7.3-4 (a finite series in cos^2 of atan(t / sqrt(df)))."""
  if df < 1:
    raise ValueError(f"degrees of freedom must be >= 1, got {df}")
  t = abs(float(t))
  if math.isinf(t):
    return 0.0
  theta = math.atan(t / math.sqrt(df))
  sin, cos2 = math.sin(theta), math.cos(theta) ** 2
  term = total = 1.0
  if df % 2:      # odd: (2 / pi) (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 + ...))
    for j in range(1, (df - 3) // 2 + 1):
      term *= cos2 * (2 * j) / (2 * j + 1)
      total += term
    inside = (2 / math.pi) * (theta + (sin * math.sqrt(cos2) * total if df > 1 else 0.0))
  else:           # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
    for j in range(1, (df - 2) // 2 + 1):
      term *= cos2 * (2 * j - 1) / (2 * j)
      total += term
    inside = sin * total
  return min(1.0, max(0.0, 1.0 - inside))


def t_quantile(p: float, df: int) -> float:
  """The t with t_two_sided_p(t, df) = p (0 < p <= 1), by bisection."""
  lo, hi = 0.0, 1.0
  while t_two_sided_p(hi, df) > p:
    lo, hi = hi, 2 * hi
  for _ in range(100):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if t_two_sided_p(mid, df) > p else (lo, mid)
  return (lo + hi) / 2


def paired_p(diff: dict) -> float:
  """The two-sided p-value of a paired difference's mean (diff: interval() of the per-seed
  differences, n >= 2): t = mean / (stdev / sqrt(n)), n - 1 degrees of freedom."""
  kept = [v for v in diff["values"] if v is not None]
  n, mean = len(kept), statistics.fmean(kept)
  sd = statistics.stdev(kept)
  if sd == 0:
    return 1.0 if mean == 0 else 0.0
  return t_two_sided_p(mean / (sd / math.sqrt(n)), n - 1)


def overlap_p(a: dict, b: dict) -> float:
  """The p at which intervals a and b (interval(), n >= 2 each) built at confidence 1 - p
  just touch: below it they overlap (`differ` at 95% is overlap_p < 0.05, up to the t
  table's rounding). A conservative p-value for a difference of means on other seeds."""
  ka, kb = ([v for v in x["values"] if v is not None] for x in (a, b))
  gap = abs(a["mean"] - b["mean"])
  se = [statistics.stdev(k) / math.sqrt(len(k)) for k in (ka, kb)]
  if gap == 0:
    return 1.0
  if se[0] == se[1] == 0:
    return 0.0
  def width(p):       # the two half-widths at confidence 1 - p
    return t_quantile(p, len(ka) - 1) * se[0] + t_quantile(p, len(kb) - 1) * se[1]
  if width(1.0) >= gap:      # (t_quantile(1) = 0: never, as gap > 0)
    return 1.0
  lo, hi = 0.0, 1.0         # width(lo) > gap >= width(hi): intervals apart above lo
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if width(mid) > gap else (lo, mid)
  return hi


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-adjusted p-values, in the order given: sorted ascending, the i-th (from 0) times
  (m - i), each at least the one before it, at most 1. Rejecting where the adjusted p < alpha
  is Holm's step-down test: the chance of any false rejection among the m is <= alpha."""
  m = len(p_values)
  order = sorted(range(m), key=lambda i: p_values[i])
  out, running = [0.0] * m, 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p_values[i]))
    out[i] = running
  return out
