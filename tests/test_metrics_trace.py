"""Tests for pdjax.metrics.trace: the exact Chrome trace events of one step, one role
switch and a few requests."""

import json

from pdjax.metrics.trace import write_chrome_trace
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
