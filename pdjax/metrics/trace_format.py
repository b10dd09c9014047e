"""The Chrome / Perfetto trace's event records, shared by the full trace (pdjax.metrics.trace)
and its binned form (pdjax.metrics.trace_bins): the process ids, the microsecond timestamps and
one constructor per event kind (metadata, complete span, instant, KV counter point).

Its own module so that both trace modules import it and neither imports the other's insides.
"""

from __future__ import annotations

INSTANCES_PID = 1
REQUESTS_PID = 2
REMESH_PID = 3


def us(seconds: float) -> float:
  """Seconds on the run's clock as the trace's microseconds (3 decimals)."""
  return round(float(seconds) * 1e6, 3)


def meta(name: str, pid: int, tid: int, value: str) -> dict:
  return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def span(name: str, cat: str, start: float, end: float, pid: int, tid: int, args: dict) -> dict:
  ts = us(start)
  return {"name": name, "cat": cat, "ph": "X", "ts": ts,
          "dur": max(0.0, round(us(end) - ts, 3)), "pid": pid, "tid": tid, "args": args}


def instant(name: str, cat: str, t: float, pid: int, tid: int, args: dict) -> dict:
  return {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": us(t), "pid": pid,
          "tid": tid, "args": args}


def counter_event(instance: str, t: float, used: int, cached: int) -> dict:
  """One point of instance's "kv pages" counter track."""
  return {"name": f"kv pages {instance}", "ph": "C", "ts": us(t), "pid": INSTANCES_PID,
          "args": {"used": used, "cached_idle": cached}}
