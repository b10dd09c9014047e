"""Where the host's time goes around each engine step, and how long devices waited for it.

Each step record (see `pdjax.scheduler.collect`) carries the host seconds of its phases:
`plan_s` (step policy and page bookkeeping), `build_s` (metadata arrays), `dispatch_s`
(building and launching the program, build included), `readback_s` (waiting for and copying
the tokens to the host), and `host_wait_s`: how long the instance sat with no step in flight
and work to do before this step was launched (the previous step's readback, its collection,
this step's plan and launch). A step dispatched ahead (overlap) has none: the device had it
queued before it finished the one before.

host_overhead per tier = host wait / (device busy + host wait), summed over the tier's
instances: the share of the time the tier had work in which its devices idled for the host.
Device busy is each step's start (its launch, or for a step dispatched ahead, the collection
of the step before it) to its collection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdjax.metrics import columns

PHASES = ("plan_s", "build_s", "dispatch_s", "readback_s", "host_wait_s")


def _sum(values: np.ndarray) -> float:
  """Left-to-right, as Python's sum() (numpy's sum adds pairwise: other last bits)."""
  return float(np.cumsum(values)[-1]) if len(values) else 0.0


def _roles(steps: Sequence[dict]) -> list[tuple[str, np.ndarray]]:
  """[(role, mask of its steps)], roles sorted (numpy over the columns; a pass per key)."""
  if not len(steps):
    return []
  role, names = columns.codes(steps, "role")
  return [(name, role == i) for i, name in enumerate(names)]


def host_overhead(steps: Sequence[dict]) -> dict[str, float | None]:
  """{role: share of its busy-or-waiting time that its devices waited for the host}; None for
  a role whose steps took no time."""
  out = {}
  if not len(steps):
    return out
  start, end, wait = columns.numbers(steps, ("start_s", "end_s", "host_wait_s"),
                                     {"host_wait_s": 0.0})
  for role, mask in _roles(steps):
    waited = _sum(wait[mask])
    busy = _sum(np.maximum(end[mask] - start[mask], 0.0))
    out[role] = waited / (busy + waited) if busy + waited > 0 else None
  return out


def host_time(steps: Sequence[dict]) -> dict[str, dict]:
  """{role: {"steps", "ahead" (steps dispatched before the previous one's tokens were read),
  "<phase>_ms_mean" and "<phase>_s_total" per phase}}."""
  out = {}
  if not len(steps):
    return out
  values = columns.numbers(steps, ("ahead",) + PHASES, dict.fromkeys(("ahead",) + PHASES, 0.0))
  for role, mask in _roles(steps):
    n = int(mask.sum())
    row = {"steps": n, "ahead": int(np.count_nonzero(values[0][mask]))}
    for phase, column in zip(PHASES, values[1:]):
      total = _sum(column[mask])
      row[f"{phase[:-2]}_ms_mean"] = 1e3 * total / n
      row[f"{phase}_total"] = total
    out[role] = row
  return out
