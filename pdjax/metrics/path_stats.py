"""Why requests took their path, and how good the path policy's predictions were (summary.json
"paths", report.md "Paths"). Pure Python.

Requests are counted by path and by the policy's reason (Request.path_reason: its "policy",
"choice" and, where it gives one, "why"). For a policy that predicts (slo_headroom), each
finished request's prediction for the path it took (remote for disaggregated, local for
colocated) is compared with what it measured: |predicted - measured| / measured of TTFT and of
TPOT, their median and p90 over the requests with both.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from pdjax.request import Request, Status

CANDIDATE = {"disaggregated": "remote", "colocated": "local"}


def path_stats(requests: Sequence[Request]) -> dict:
  """{"by_path": {path: n}, "by_reason": {"policy: why -> choice": n}, "prediction_error":
  {"ttft": {"n", "p50", "p90"}, "tpot": {...}}} (prediction_error empty without predictions)."""
  by_path, by_reason = Counter(), Counter()
  errors = {"ttft": [], "tpot": []}
  for r in requests:
    reason = r.path_reason
    if not r.path or reason is None:
      continue                       # (rejected before routing, or never admitted)
    by_path[r.path] += 1
    why = f": {reason['why']}" if "why" in reason else ""
    by_reason[f"{reason['policy']}{why} -> {reason['choice']}"] += 1
    predicted = reason.get(CANDIDATE.get(r.path, ""))
    if r.status != Status.FINISHED or not isinstance(predicted, dict):
      continue
    for key, measured in (("ttft", r.ttft_s), ("tpot", r.tpot_s)):
      if measured:
        errors[key].append(abs(predicted[f"{key}_s"] - measured) / measured)
  prediction = {}
  for key, values in errors.items():
    if values:
      p50, p90 = np.percentile(np.asarray(values, dtype=np.float64), [50, 90])
      prediction[key] = {"n": len(values), "p50": float(p50), "p90": float(p90)}
  return {"by_path": dict(by_path), "by_reason": dict(by_reason.most_common()),
          "prediction_error": prediction}


def path_section(stats: dict) -> list[str]:
  """report.md's "Paths": counts by path and reason, then the prediction error."""
  lines = ["## Paths", ""]
  lines.append("- By path: " + (", ".join(f"{k} {v}" for k, v in sorted(stats["by_path"].items()))
                                or "none"))
  for reason, n in stats["by_reason"].items():
    lines.append(f"- {reason}: {n}")
  for key, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
    e = stats["prediction_error"].get(key)
    if e:
      lines.append(f"- {name} prediction error (|predicted - measured| / measured, "
                   f"{e['n']} requests): median {e['p50'] * 100:.1f}%, "
                   f"p90 {e['p90'] * 100:.1f}%")
  return lines + [""]
