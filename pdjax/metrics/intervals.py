"""Means with 95% confidence intervals over repeats, and when two of them differ (pure Python).

A run on a shared machine (or a seeded workload drawn again) gives a different number each
time; one run's number carries no noise estimate. With `repeats` = N, each mode runs N times
with seeds seed .. seed+N-1 and every table metric is reported as mean ± half-width of its
95% interval, Student's t with N - 1 degrees of freedom:

  half_width = t_{0.975, N-1} * stdev(values) / sqrt(N)     (None when N < 2)

Two modes differ "beyond the noise" on a metric only when their intervals do not overlap
(a conservative test: overlapping 95% intervals can still differ at 95%, never the other way).
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

