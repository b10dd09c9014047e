"""A run as a Chrome / Perfetto JSON trace (chrome://tracing, ui.perfetto.dev).

Process 1 "instances": one thread per instance (sorted by name, tid 1..), a complete
event per engine step named by its kind (args num_seqs, num_tokens), and an instant event
per role switch. Process 2 "requests": one thread per request (in the given order, tid
1..), with complete events for its phases queue (arrival -> prefill start), prefill,
transfer (the KV transfer gap), wait_decode (transfer end, or prefill end, -> decode
start; only when positive) and decode (decode start -> finish); a phase with a None
timestamp is left out. Rejected and failed requests get an instant event at finish_s.
Page-pool occupancy is a counter track per instance on process 1. Steps recorded with host
timing (the driver's) add a "<instance> host" thread with the host's plan, dispatch and readback
around each step, and "waiting for host" spans on the instance's thread where its device idled
with work to do (pdjax.metrics.host_time). Timestamps are microseconds on the run's clock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from pdjax.request import Request, Status

INSTANCES_PID = 1
REQUESTS_PID = 2


def _us(seconds: float) -> float:
  return round(float(seconds) * 1e6, 3)


def _meta(name: str, pid: int, tid: int, value: str) -> dict:
  return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def _span(name: str, cat: str, start: float, end: float, pid: int, tid: int,
          args: dict) -> dict:
  return {"name": name, "cat": cat, "ph": "X", "ts": _us(start),
          "dur": max(0.0, round(_us(end) - _us(start), 3)), "pid": pid, "tid": tid,
          "args": args}


def _instant(name: str, cat: str, t: float, pid: int, tid: int, args: dict) -> dict:
  return {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": _us(t), "pid": pid,
          "tid": tid, "args": args}


def instance_events(steps: Sequence[dict], role_switches: Sequence[dict]) -> list[dict]:
  """Process 1: metadata, one X event per step and one i event per role switch."""
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in role_switches})
  tids = {n: i + 1 for i, n in enumerate(names)}
  events = [_meta("process_name", INSTANCES_PID, 0, "instances")]
  events += [_meta("thread_name", INSTANCES_PID, tids[n], n) for n in names]
  timed = sorted({s["instance"] for s in steps if "dispatched_s" in s})
  host = {n: len(names) + i + 1 for i, n in enumerate(timed)}
  events += [_meta("thread_name", INSTANCES_PID, host[n], f"{n} host") for n in timed]
  for s in steps:
    args = {"num_seqs": int(s["num_seqs"]), "num_tokens": int(s["num_tokens"])}
    if "ahead" in s:
      args["ahead"] = bool(s["ahead"])
    events.append(_span(s["kind"], "step", s["start_s"], s["end_s"], INSTANCES_PID,
                        tids[s["instance"]], args))
    if s["instance"] in host:
      events += _host_phases(s, tids[s["instance"]], host[s["instance"]])
  for sw in role_switches:
    events.append(_instant(f"role {sw['from']}->{sw['to']}", "role_switch", sw["t"],
                           INSTANCES_PID, tids[sw["instance"]],
                           {"from": sw["from"], "to": sw["to"]}))
  return events


def _host_phases(s: dict, tid: int, host_tid: int) -> list[dict]:
  """The host's phases around a step (pdjax.metrics.host_time), on the instance's host track:
  plan and dispatch before its launch, readback before its collection; the device's wait for
  the host before a step, on the instance's own track."""
  if "dispatched_s" not in s:   # recorded without host timing (e.g. a hand-written list)
    return []
  launched, out = s["dispatched_s"], []
  phases = [("plan", launched - s["dispatch_s"] - s["plan_s"], launched - s["dispatch_s"]),
            ("dispatch", launched - s["dispatch_s"], launched),
            ("readback", s["end_s"] - s["readback_s"], s["end_s"])]
  for name, start, end in phases:
    if end > start:
      out.append(_span(name, "host", start, end, INSTANCES_PID, host_tid, {}))
  if s.get("host_wait_s", 0.0) > 0:
    out.append(_span("waiting for host", "host_wait", s["start_s"] - s["host_wait_s"],
                     s["start_s"], INSTANCES_PID, tid, {}))
  return out


def request_phases(r: Request) -> list[tuple[str, float, float, dict]]:
  """(phase, start_s, end_s, args) for each phase of r whose timestamps are known."""
  out = []

  def add(name, start, end, args):
    if start is not None and end is not None:
      out.append((name, start, end, args))

  add("queue", r.arrival_s, r.prefill_start_s, {})
  add("prefill", r.prefill_start_s, r.prefill_end_s,
      {"instance": r.prefill_instance, "prompt_len": r.prompt_len})
  add("transfer", r.transfer_start_s, r.transfer_end_s,
      {"bytes": r.transfer_bytes, "seconds": r.transfer_s})
  ready = r.transfer_end_s if r.transfer_end_s is not None else r.prefill_end_s
  if ready is not None and r.decode_start_s is not None and r.decode_start_s > ready:
    add("wait_decode", ready, r.decode_start_s, {})
  add("decode", r.decode_start_s, r.finish_s,
      {"instance": r.decode_instance, "output_len": len(r.output_ids),
       "preemptions": r.preemptions})
  return out


def request_events(requests: Sequence[Request]) -> list[dict]:
  """Process 2: metadata and the phase events of every request."""
  events = [_meta("process_name", REQUESTS_PID, 0, "requests")]
  for tid, r in enumerate(requests, start=1):
    events.append(_meta("thread_name", REQUESTS_PID, tid, r.id))
    for name, start, end, args in request_phases(r):
      events.append(_span(name, "request", start, end, REQUESTS_PID, tid, args))
    if r.status in (Status.REJECTED, Status.FAILED) and r.finish_s is not None:
      events.append(_instant(r.status.value, "request", r.finish_s, REQUESTS_PID, tid,
                             {"reason": r.reason}))
  return events


def pool_counters(samples: Sequence[dict]) -> list[dict]:
  """Process 1: a counter track "kv pages <instance>" per instance (pages used by sequences,
  cached idle pages), one point per state sample."""
  return [{"name": f"kv pages {s['instance']}", "ph": "C", "ts": _us(s["t"]),
           "pid": INSTANCES_PID,
           "args": {"used": s["kv_pages_used"], "cached_idle": s.get("kv_pages_cached", 0)}}
          for s in samples]


def write_chrome_trace(path: str, *, requests: Sequence[Request], steps: Sequence[dict],
                       role_switches: Sequence[dict], samples: Sequence[dict] = ()) -> None:
  """Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to path."""
  trace = {"traceEvents": instance_events(steps, role_switches) + request_events(requests)
           + pool_counters(samples), "displayTimeUnit": "ms"}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(trace, f)
