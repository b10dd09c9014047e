"""Tests for pdjax.metrics.trace: the exact Chrome trace events of one step, one role
switch and a few requests; full detail on simulated runs equal to the writer before the bound;
the binned form past max_step_events (pdjax.metrics.trace_bins), exact and on simulated runs."""

import json

import pytest

from pdjax.metrics.trace import (request_phases, trace_events, write_chrome_trace,
                                 write_events)
from pdjax.request import Request, SamplingParams, Status


def disaggregated_request():
  r = Request(id="r0", arrival_s=0.1, prompt_ids=[1] * 7,
              sampling=SamplingParams(max_new_tokens=2))
  r.prefill_instance, r.decode_instance = "p0", "d0"
  r.prefill_start_s, r.prefill_end_s = 0.2, 0.5
  r.transfer_start_s, r.transfer_end_s = 0.5, 0.55
  r.transfer_bytes, r.transfer_s = 1024, 0.05
  r.decode_start_s = 0.6
  r.add_token(3, 0.5)
  r.add_token(4, 1.0)
  r.finish(Status.FINISHED, 1.0)
  return r


STEP = {"instance": "p0", "role": "prefill", "kind": "prefill", "start_s": 0.2,
        "end_s": 0.5, "num_seqs": 1, "num_tokens": 7}
SWITCH = {"t": 0.7, "instance": "d0", "from": "prefill", "to": "decode"}


def load(tmp_path, **kw):
  path = tmp_path / "sub" / "trace.json"
  write_chrome_trace(str(path), **kw)
  trace = json.loads(path.read_text())
  assert set(trace) == {"traceEvents", "displayTimeUnit"}
  assert trace["displayTimeUnit"] == "ms"
  return trace["traceEvents"]


def test_exact_events(tmp_path):
  events = load(tmp_path, requests=[disaggregated_request()], steps=[STEP],
                role_switches=[SWITCH])
  meta = lambda name, pid, tid, v: {"name": name, "ph": "M", "pid": pid, "tid": tid,
                                    "args": {"name": v}}

  def x(name, cat, ts, dur, pid, tid, args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
            "tid": tid, "args": args}

  assert events == [
      meta("process_name", 1, 0, "instances"),
      meta("thread_name", 1, 1, "d0"),
      meta("thread_name", 1, 2, "p0"),
      x("prefill", "step", 200000.0, 300000.0, 1, 2, {"num_seqs": 1, "num_tokens": 7}),
      {"name": "role prefill->decode", "cat": "role_switch", "ph": "i", "s": "t",
       "ts": 700000.0, "pid": 1, "tid": 1, "args": {"from": "prefill", "to": "decode"}},
      meta("process_name", 2, 0, "requests"),
      meta("thread_name", 2, 1, "r0"),
      x("queue", "request", 100000.0, 100000.0, 2, 1, {}),
      x("prefill", "request", 200000.0, 300000.0, 2, 1,
        {"instance": "p0", "prompt_len": 7}),
      x("transfer", "request", 500000.0, 50000.0, 2, 1, {"bytes": 1024, "seconds": 0.05}),
      x("wait_decode", "request", 550000.0, 50000.0, 2, 1, {}),
      x("decode", "request", 600000.0, 400000.0, 2, 1,
        {"instance": "d0", "output_len": 2, "preemptions": 0}),
  ]


def test_colocated_and_rejected_requests(tmp_path):
  colo = Request(id="c", arrival_s=0.0, prompt_ids=[1, 2])
  colo.prefill_start_s, colo.prefill_end_s, colo.decode_start_s = 0.0, 0.1, 0.3
  colo.add_token(1, 0.1)
  colo.finish(Status.FINISHED, 0.4)
  rej = Request(id="x", arrival_s=0.2, prompt_ids=[1])
  rej.finish(Status.REJECTED, 0.25, "too long")
  events = load(tmp_path, requests=[colo, rej], steps=[], role_switches=[])
  phases = [(e["tid"], e["name"], e["ts"], e.get("dur")) for e in events
            if e["pid"] == 2 and e["ph"] != "M"]
  assert phases == [(1, "queue", 0.0, 0.0), (1, "prefill", 0.0, 100000.0),
                    (1, "wait_decode", 100000.0, 200000.0),
                    (1, "decode", 300000.0, 100000.0),
                    (2, "rejected", 250000.0, None)]
  assert events[-1]["args"] == {"reason": "too long"} and events[-1]["ph"] == "i"
  assert [e["args"]["name"] for e in events if e["name"] == "thread_name"] == ["c", "x"]


def test_empty_trace(tmp_path):
  events = load(tmp_path, requests=[], steps=[], role_switches=[])
  assert [e["args"]["name"] for e in events] == ["instances", "requests"]


# --- The writer before the bounded trace (json.dump of one object), as the reference for full
# detail: max_step_events=None must write exactly these events.

def _old_us(seconds):
  return round(float(seconds) * 1e6, 3)


def _old_meta(name, pid, tid, value):
  return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def _old_span(name, cat, start, end, pid, tid, args):
  return {"name": name, "cat": cat, "ph": "X", "ts": _old_us(start),
          "dur": max(0.0, round(_old_us(end) - _old_us(start), 3)), "pid": pid, "tid": tid,
          "args": args}


def _old_instant(name, cat, t, pid, tid, args):
  return {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": _old_us(t), "pid": pid,
          "tid": tid, "args": args}


def _old_host_phases(s, tid, host_tid):
  if "dispatched_s" not in s:
    return []
  launched, out = s["dispatched_s"], []
  phases = [("plan", launched - s["dispatch_s"] - s["plan_s"], launched - s["dispatch_s"]),
            ("dispatch", launched - s["dispatch_s"], launched),
            ("readback", s["end_s"] - s["readback_s"], s["end_s"])]
  for name, start, end in phases:
    if end > start:
      out.append(_old_span(name, "host", start, end, 1, host_tid, {}))
  if s.get("host_wait_s", 0.0) > 0:
    out.append(_old_span("waiting for host", "host_wait", s["start_s"] - s["host_wait_s"],
                         s["start_s"], 1, tid, {}))
  return out


def old_trace(requests, steps, role_switches, samples):
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in role_switches})
  tids = {n: i + 1 for i, n in enumerate(names)}
  events = [_old_meta("process_name", 1, 0, "instances")]
  events += [_old_meta("thread_name", 1, tids[n], n) for n in names]
  timed = sorted({s["instance"] for s in steps if "dispatched_s" in s})
  host = {n: len(names) + i + 1 for i, n in enumerate(timed)}
  events += [_old_meta("thread_name", 1, host[n], f"{n} host") for n in timed]
  for s in steps:
    args = {"num_seqs": int(s["num_seqs"]), "num_tokens": int(s["num_tokens"])}
    if "ahead" in s:
      args["ahead"] = bool(s["ahead"])
    events.append(_old_span(s["kind"], "step", s["start_s"], s["end_s"], 1,
                            tids[s["instance"]], args))
    if s["instance"] in host:
      events += _old_host_phases(s, tids[s["instance"]], host[s["instance"]])
  for sw in role_switches:
    events.append(_old_instant(f"role {sw['from']}->{sw['to']}", "role_switch", sw["t"], 1,
                               tids[sw["instance"]], {"from": sw["from"], "to": sw["to"]}))
  events.append(_old_meta("process_name", 2, 0, "requests"))
  for tid, r in enumerate(requests, start=1):
    events.append(_old_meta("thread_name", 2, tid, r.id))
    for name, start, end, args in request_phases(r):
      events.append(_old_span(name, "request", start, end, 2, tid, args))
    if r.status in (Status.REJECTED, Status.FAILED) and r.finish_s is not None:
      events.append(_old_instant(r.status.value, "request", r.finish_s, 2, tid,
                                 {"reason": r.reason}))
  events += [{"name": f"kv pages {s['instance']}", "ph": "C", "ts": _old_us(s["t"]), "pid": 1,
              "args": {"used": s["kv_pages_used"], "cached_idle": s.get("kv_pages_cached", 0)}}
             for s in samples]
  return json.loads(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


@pytest.fixture(scope="module", params=["role_switch", "prefix_faults"])
def sim_run(request):
  """A small simulated run (tests/helpers/sim_snapshots.py configs): role switches, host timing, a
  prefix cache."""
  from helpers.sim_snapshots import CONFIGS, _config
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = _config(CONFIGS[request.param])
  _, result, _ = execute(cfg, config_lib.validate(cfg), "disaggregated", None, quiet=True)
  return result


def run_kw(result):
  return dict(requests=result.requests, steps=result.steps,
              role_switches=result.role_switches, samples=result.samples)


def test_full_detail_is_the_old_trace(tmp_path, sim_run):
  kw = run_kw(sim_run)
  path = tmp_path / "full.json"
  write_chrome_trace(str(path), max_step_events=None, **kw)
  old = old_trace(**kw)
  assert json.loads(path.read_text()) == old
  assert len(old["traceEvents"]) > 300   # written in many chunks below
  with open(tmp_path / "chunks.json", "w") as f:
    f.write("[")
    write_events(f, trace_events(max_step_events=None, **kw), chunk=7)
    f.write("]")
  assert json.loads((tmp_path / "chunks.json").read_text()) == old["traceEvents"]
  # Under the default bound a small run is not binned.
  assert load(tmp_path, **kw) == old["traceEvents"]


def timed_step(inst, kind, start, end, seqs, tokens, host_wait=0.0, ahead=False):
  return {"instance": inst, "role": "decode", "kind": kind, "start_s": start, "end_s": end,
          "num_seqs": seqs, "num_tokens": tokens, "ahead": ahead, "dispatched_s": start,
          "plan_s": 0.001, "build_s": 0.0, "dispatch_s": 0.002, "readback_s": 0.003,
          "host_wait_s": host_wait}


def test_binned_steps_and_counters_exact(tmp_path):
  """Over the bound (4): 2 instances x 2 bins of 0.5 s (the steps start within 0.9 s); a
  step belongs to the bin it starts in, its busy time clipped to that bin."""
  steps = [timed_step("p0", "prefill", 0.0, 0.1, 1, 10, host_wait=0.01),
           timed_step("p0", "decode", 0.1, 0.15, 2, 2),
           timed_step("p0", "decode", 0.5, 0.6, 2, 2, ahead=True),
           timed_step("p0", "decode", 0.9, 1.0, 2, 2),
           timed_step("d0", "decode", 0.2, 0.7, 3, 3)]
  samples = [{"t": t, "instance": i, "kv_pages_used": u, "kv_pages_cached": c}
             for t, i, u, c in [(0.0, "p0", 1, 0), (0.1, "p0", 3, 1), (0.5, "p0", 2, 4),
                                (0.9, "p0", 5, 0), (0.2, "d0", 7, 0)]]
  switch = {"t": 0.8, "instance": "d0", "from": "prefill", "to": "decode"}
  events = load(tmp_path, requests=[], steps=steps, role_switches=[switch], samples=samples,
                max_step_events=4)
  full = "output.trace_steps=full (write_chrome_trace(max_step_events=None))"

  def span(name, ts, dur, tid, steps, kinds, seqs, tokens, busy, host_wait):
    return {"name": name, "cat": "step_bin", "ph": "X", "ts": ts, "dur": dur, "pid": 1,
            "tid": tid, "args": {"steps": steps, "kinds": kinds, "num_seqs": seqs,
                                 "num_tokens": tokens, "busy_fraction": busy, "bin_s": 0.5,
                                 "host_wait_s": host_wait}}

  def counter(inst, ts, used, cached):
    return {"name": f"kv pages {inst}", "ph": "C", "ts": ts, "pid": 1,
            "args": {"used": used, "cached_idle": cached}}

  assert events == [
      {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "instances"}},
      {"name": "process_labels", "ph": "M", "pid": 1, "tid": 0,
       "args": {"labels": f"5 steps binned into 3 spans of 0.5 s per instance; every step: "
                          f"{full}"}},
      {"name": "trace binned", "cat": "notice", "ph": "i", "s": "g", "ts": 0.0, "pid": 1,
       "tid": 0, "args": {"steps": 5, "spans": 3, "bin_s": 0.5, "max_step_events": 4,
                          "full_detail": full,
                          "host_tracks": "left out; host waits summed in each span's "
                                         "host_wait_s",
                          "kv_counters": "max per instance per bin"}},
      {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "d0"}},
      {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "p0"}},
      span("decode", 200000.0, 500000.0, 1, 1, {"decode": 1}, 3, 3, 0.6, 0.0),
      span("steps", 0.0, 150000.0, 2, 2, {"decode": 1, "prefill": 1}, 3, 12, 0.3, 0.01),
      span("decode", 500000.0, 500000.0, 2, 2, {"decode": 2}, 4, 4, 0.4, 0.0),
      {"name": "role prefill->decode", "cat": "role_switch", "ph": "i", "s": "t",
       "ts": 800000.0, "pid": 1, "tid": 1, "args": {"from": "prefill", "to": "decode"}},
      {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "requests"}},
      counter("d0", 200000.0, 7, 0), counter("p0", 0.0, 3, 1), counter("p0", 500000.0, 5, 4),
  ]
  with pytest.raises(ValueError):
    load(tmp_path, requests=[], steps=steps, role_switches=[], max_step_events=0)


def test_binned_sim_run_keeps_totals_and_every_request(tmp_path, sim_run):
  kw = run_kw(sim_run)
  full = load(tmp_path, max_step_events=None, **kw)
  binned = load(tmp_path, max_step_events=50, **kw)
  spans = [e for e in binned if e.get("cat") == "step_bin"]
  assert 0 < len(spans) <= 50
  assert not [e for e in binned if e.get("cat") in ("step", "host", "host_wait")]
  assert sum(e["args"]["steps"] for e in spans) == len(sim_run.steps)
  assert sum(e["args"]["num_tokens"] for e in spans) == sum(s["num_tokens"]
                                                            for s in sim_run.steps)
  kinds = {}
  for e in spans:
    for k, n in e["args"]["kinds"].items():
      kinds[k] = kinds.get(k, 0) + n
  assert kinds == {k: sum(s["kind"] == k for s in sim_run.steps) for k in kinds}
  assert all(0 <= e["args"]["busy_fraction"] <= 1 for e in spans)
  for tid in {e["tid"] for e in spans}:   # one instance's spans follow each other
    mine = [e for e in spans if e["tid"] == tid]
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(mine, mine[1:]))
  keep = lambda evs: [e for e in evs if e["pid"] == 2 or e.get("cat") == "role_switch"]
  assert keep(binned) == keep(full)
  counters = [e for e in binned if e["ph"] == "C"]
  assert len(counters) <= 50
  for inst in {s["instance"] for s in sim_run.samples}:
    assert max(e["args"]["used"] for e in counters if e["name"] == f"kv pages {inst}") == max(
        s["kv_pages_used"] for s in sim_run.samples if s["instance"] == inst)
  notice = [e for e in binned if e["name"] == "trace binned"]
  assert notice[0]["args"]["steps"] == len(sim_run.steps)
