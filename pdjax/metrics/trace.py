"""A run as a Chrome / Perfetto JSON trace (chrome://tracing, ui.perfetto.dev).

Process 1 "instances": one thread per instance (sorted by name, tid 1..), a complete
event per engine step named by its kind (args num_seqs, num_tokens), and an instant event
per role switch. Process 2 "requests": one thread per request (in the given order, tid
1..), with complete events for its phases queue (arrival -> prefill start), prefill,
transfer (the KV transfer gap), wait_decode (transfer end, or prefill end, -> decode
start; only when positive) and decode (decode start -> finish); a phase with a None
timestamp is left out. Rejected and failed requests get an instant event at finish_s.
Page-pool occupancy is a counter track per instance on process 1. Process 3 "re-meshes" (a run
with scheduler.role_switch=remesh): a track per tier, a span per phase of each re-mesh. Steps
recorded with host timing (the driver's) add a "<instance> host" thread with the host's plan, dispatch and readback
around each step, and "waiting for host" spans on the instance's thread where its device idled
with work to do (pdjax.metrics.host_time). Timestamps are microseconds on the run's clock.

Bounded by default: a run with more engine steps than `max_step_events` (an hour-long trace
has millions) gets its steps binned (pdjax.metrics.trace_bins): one span per instance per time
bin instead of one per step, host phases and waits folded into that span's args, and KV
counters reduced to their max per bin; every request keeps its own track. Full detail is
max_step_events=None (the config's output.trace_steps=full). The file is written event by
event in chunks with json's C encoder (json.dump of one big object uses the pure-Python one).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from pdjax.metrics import columns, trace_bins
from pdjax.metrics.kv_layer import host_tier_pages
from pdjax.metrics.trace_format import (INSTANCES_PID, REMESH_PID, REQUESTS_PID,  # noqa: F401
                                        counter_event)
from pdjax.metrics.trace_format import instant as _instant
from pdjax.metrics.trace_format import meta as _meta
from pdjax.metrics.trace_format import span as _span
from pdjax.metrics.trace_format import us as _us
from pdjax.request import Request, Status

MAX_STEP_EVENTS = 200_000   # write_chrome_trace's default bound on step events


def instance_events(steps: Sequence[dict], role_switches: Sequence[dict]) -> list[dict]:
  """Process 1: metadata, one X event per step and one i event per role switch."""
  return list(_instance_events(steps, role_switches))


def instance_tids(steps: Sequence[dict], role_switches: Sequence[dict]) -> dict[str, int]:
  """{instance: its thread id on process 1}: 1.. in name order."""
  names = sorted(set(columns.codes(steps, "instance")[1])
                 | {s["instance"] for s in role_switches})
  return {n: i + 1 for i, n in enumerate(names)}


def _instance_events(steps: Sequence[dict], role_switches: Sequence[dict]) -> Iterator[dict]:
  tids = instance_tids(steps, role_switches)
  yield _meta("process_name", INSTANCES_PID, 0, "instances")
  yield from (_meta("thread_name", INSTANCES_PID, tid, n) for n, tid in tids.items())
  code, names = columns.codes(steps, "instance")
  timed = [names[i] for i in np.unique(code[columns.present(steps, "dispatched_s")]).tolist()]
  host = {n: len(tids) + i + 1 for i, n in enumerate(timed)}
  yield from (_meta("thread_name", INSTANCES_PID, host[n], f"{n} host") for n in timed)
  for s in steps:
    args = {"num_seqs": int(s["num_seqs"]), "num_tokens": int(s["num_tokens"])}
    if "ahead" in s:
      args["ahead"] = bool(s["ahead"])
    yield _span(s["kind"], "step", s["start_s"], s["end_s"], INSTANCES_PID,
                tids[s["instance"]], args)
    if s["instance"] in host:
      yield from _host_phases(s, tids[s["instance"]], host[s["instance"]])
  yield from _role_switch_events(role_switches, tids)


def _role_switch_events(role_switches: Sequence[dict], tids: dict[str, int]) -> Iterator[dict]:
  for sw in role_switches:
    yield _instant(f"role {sw['from']}->{sw['to']}", "role_switch", sw["t"], INSTANCES_PID,
                   tids[sw["instance"]], {"from": sw["from"], "to": sw["to"]})


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
  return list(_request_events(requests))


STREAM_TID = 1_000_000   # + a request's tid: the track of its KV streamed during its prefill


def _request_events(requests: Sequence[Request]) -> Iterator[dict]:
  yield _meta("process_name", REQUESTS_PID, 0, "requests")
  for tid, r in enumerate(requests, start=1):
    yield _meta("thread_name", REQUESTS_PID, tid, r.id)
    for name, start, end, args in request_phases(r):
      if name == "transfer" and r.prefill_end_s is not None and start < r.prefill_end_s:
        # streamed (kv.stream_layers): it overlaps the prefill span, so it gets a track of
        # its own under the request's (spans on one track must nest)
        yield _meta("thread_name", REQUESTS_PID, STREAM_TID + tid, f"{r.id} KV stream")
        yield _span(name, "request", start, end, REQUESTS_PID, STREAM_TID + tid, args)
        yield from _group_spans(r, STREAM_TID + tid)
        continue
      yield _span(name, "request", start, end, REQUESTS_PID, tid, args)
    if r.status in (Status.REJECTED, Status.FAILED) and r.finish_s is not None:
      yield _instant(r.status.value, "request", r.finish_s, REQUESTS_PID, tid,
                     {"reason": r.reason})


def _group_spans(r: Request, tid: int) -> Iterator[dict]:
  """A streamed transfer's layer groups, nested in its span: group g from the landing of group
  g - 1 (group 0: the transfer's start) to its own, as observed (`transfer_group_ends_s`);
  the last one's part after the prefill span is the exposed transfer."""
  begin = r.transfer_start_s
  for g, offset in enumerate(r.transfer_group_ends_s):
    end = min(r.transfer_start_s + offset, r.transfer_end_s)
    yield _span(f"group {g}", "request", begin, max(end, begin), REQUESTS_PID, tid,
                {"landed_after_s": offset, "of": len(r.transfer_group_ends_s)})
    begin = max(end, begin)


def pool_counters(samples: Sequence[dict]) -> list[dict]:
  """Process 1: a counter track "kv pages <instance>" per instance (pages used by sequences,
  cached idle pages), one point per state sample."""
  return [counter_event(s["instance"], s["t"], s["kv_pages_used"], s.get("kv_pages_cached", 0))
          for s in samples]


def remesh_events(events: Sequence[dict]) -> Iterator[dict]:
  """Process 3: a track per re-meshed tier, one span per phase of each re-mesh (drain,
  reshard, compile, migrate, then any wait before the rejoin), in that order from its start."""
  if not events:
    return
  yield _meta("process_name", REMESH_PID, 0, "re-meshes")
  tids = {role: i + 1 for i, role in enumerate(sorted({e["role"] for e in events}))}
  yield from (_meta("thread_name", REMESH_PID, tid, f"{role} re-mesh")
              for role, tid in tids.items())
  for e in events:
    t = e["t_s"]
    for phase, seconds in e.get("phases_s", {}).items():
      yield _span(phase, "remesh", t, t + seconds, REMESH_PID, tids[e["role"]],
                  {"from": e["from"], "to": e["to"], "ok": e.get("ok", False)})
      t += seconds


def trace_events(*, requests: Sequence[Request], steps: Sequence[dict],
                 role_switches: Sequence[dict], samples: Sequence[dict] = (),
                 max_step_events: int | None = MAX_STEP_EVENTS,
                 remeshes: Sequence[dict] = (),
                 node_of: dict | None = None) -> Iterator[dict]:
  """The events of write_chrome_trace, in file order: process 1 (instances), process 2
  (requests), then the KV counters. Steps are binned when there are more than max_step_events
  (None: never), the counters when there are more samples than that."""
  if max_step_events is not None and max_step_events < 1:
    raise ValueError(f"max_step_events must be >= 1 or None, got {max_step_events}")
  return itertools.chain(_trace_events(requests, steps, role_switches, samples,
                                       max_step_events, node_of), remesh_events(remeshes))


def _trace_events(requests: Sequence[Request], steps: Sequence[dict],
                  role_switches: Sequence[dict], samples: Sequence[dict],
                  max_step_events: int | None, node_of: dict | None = None) -> Iterator[dict]:
  bin_steps = max_step_events is not None and len(steps) > max_step_events
  bin_samples = max_step_events is not None and len(samples) > max_step_events
  if bin_steps:
    tids = instance_tids(steps, role_switches)
    spans, info = trace_bins.binned_steps(steps, tids, max_step_events)
    yield _meta("process_name", INSTANCES_PID, 0, "instances")
    yield from trace_bins.notice_events(info, max_step_events)
    yield from (_meta("thread_name", INSTANCES_PID, tid, n) for n, tid in tids.items())
    yield from spans
    yield from _role_switch_events(role_switches, tids)
  else:
    yield from _instance_events(steps, role_switches)
  yield from _request_events(requests)
  if bin_samples:
    yield from trace_bins.binned_counters(samples, max_step_events)
  else:
    yield from pool_counters(samples)
  yield from host_tier_counter(samples, max_step_events if bin_samples else None, node_of)


def host_tier_counter(samples: Sequence[dict], limit: int | None,
                      node_of: dict | None = None) -> list[dict]:
  """Process 1: the node's host KV tier's "host tier pages" counter track (samples carry it
  when kv.host_tier_pages is on; node_of, {instance: node} with cluster.nodes > 1: one track
  per node, "host tier pages (node k)"), one point per sample or, with a limit, per time bin
  (max)."""
  out = []
  for node, (t, pages) in host_tier_pages(samples, node_of).items():
    if limit is not None:
      b, _, _ = trace_bins.bin_index(t, 1, limit)
      starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
      t, pages = t[starts], np.maximum.reduceat(pages, starts)
    name = "host tier pages" if node_of is None else f"host tier pages (node {node})"
    out += [{"name": name, "ph": "C", "ts": _us(ts), "pid": INSTANCES_PID,
             "args": {"pages": int(n)}} for ts, n in zip(t.tolist(), pages.tolist())]
  return out


def write_events(f, events: Iterable[dict], chunk: int = 20_000) -> None:
  """Writes events to the open text file f as the items of a JSON array (no brackets),
  json.dumps-ing `chunk` events at a time (json's C encoder)."""
  buf, first = [], True
  for e in events:
    buf.append(e)
    if len(buf) >= chunk:
      f.write(("" if first else ", ") + json.dumps(buf)[1:-1])
      buf, first = [], False
  if buf:
    f.write(("" if first else ", ") + json.dumps(buf)[1:-1])


def write_chrome_trace(path: str, *, requests: Sequence[Request], steps: Sequence[dict],
                       role_switches: Sequence[dict], samples: Sequence[dict] = (),
                       max_step_events: int | None = MAX_STEP_EVENTS,
                       remeshes: Sequence[dict] = (), node_of: dict | None = None) -> None:
  """Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to path: every event (see the
  module docstring) when the run has at most max_step_events steps (None: always), else the
  steps binned per instance and time (pdjax.metrics.trace_bins). node_of: {instance: node}
  with cluster.nodes > 1 (a host tier track per node)."""
  events = trace_events(requests=requests, steps=steps, role_switches=role_switches,
                        samples=samples, max_step_events=max_step_events, remeshes=remeshes,
                        node_of=node_of)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f, _no_gc():
    f.write('{"traceEvents": [')
    write_events(f, events)
    f.write('], "displayTimeUnit": "ms"}')


@contextlib.contextmanager
def _no_gc():
  """Python's cycle collector off: the events are acyclic (freed as they are written), and
  each full collection would walk the run's millions of records."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()
