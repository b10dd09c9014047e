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

PHASES = ("plan_s", "build_s", "dispatch_s", "readback_s", "host_wait_s")


def _by_role(steps: Sequence[dict]) -> dict[str, list[dict]]:
  out: dict[str, list[dict]] = {}
  for s in steps:
    out.setdefault(s["role"], []).append(s)
  return dict(sorted(out.items()))


def host_overhead(steps: Sequence[dict]) -> dict[str, float | None]:
  """{role: share of its busy-or-waiting time that its devices waited for the host}; None for
  a role whose steps took no time."""
  out = {}
  for role, st in _by_role(steps).items():
    wait = sum(s.get("host_wait_s", 0.0) for s in st)
    busy = sum(max(s["end_s"] - s["start_s"], 0.0) for s in st)
    out[role] = wait / (busy + wait) if busy + wait > 0 else None
  return out


def host_time(steps: Sequence[dict]) -> dict[str, dict]:
  """{role: {"steps", "ahead" (steps dispatched before the previous one's tokens were read),
  "<phase>_ms_mean" and "<phase>_s_total" per phase}}."""
  out = {}
  for role, st in _by_role(steps).items():
    row = {"steps": len(st), "ahead": sum(bool(s.get("ahead")) for s in st)}
    for phase in PHASES:
      total = sum(s.get(phase, 0.0) for s in st)
      row[f"{phase[:-2]}_ms_mean"] = 1e3 * total / len(st)
      row[f"{phase}_total"] = total
    out[role] = row
  return out
