"""host_overhead and host_time from step records, and their trace spans: exact values."""

from pdjax.metrics.host_time import host_overhead, host_time
from pdjax.metrics.trace import instance_events


def _step(role, start, end, wait, ahead=False, **phases):
  rec = {"instance": f"{role}-0", "role": role, "kind": "decode", "start_s": start,
         "end_s": end, "num_seqs": 1, "num_tokens": 1, "ahead": ahead, "host_wait_s": wait,
         "dispatched_s": start, "plan_s": 0.002, "dispatch_s": 0.001, "build_s": 0.0005,
         "readback_s": 0.003}
  rec.update(phases)
  return rec


STEPS = [_step("decode", 0.0, 0.1, 0.0), _step("decode", 0.13, 0.2, 0.03),
         _step("decode", 0.2, 0.3, 0.0, ahead=True), _step("prefill", 0.0, 0.5, 0.0)]


def test_host_overhead_is_the_wait_over_busy_plus_wait():
  # decode: busy 0.1 + 0.07 + 0.1 = 0.27 s, waited 0.03 s -> 0.03 / 0.30
  out = host_overhead(STEPS)
  assert list(out) == ["decode", "prefill"]
  assert abs(out["decode"] - 0.1) < 1e-12 and out["prefill"] == 0.0


def test_host_time_means_and_ahead_counts():
  t = host_time(STEPS)["decode"]
  assert (t["steps"], t["ahead"]) == (3, 1)
  assert abs(t["plan_ms_mean"] - 2.0) < 1e-9 and abs(t["readback_ms_mean"] - 3.0) < 1e-9
  assert abs(t["host_wait_s_total"] - 0.03) < 1e-12


def test_trace_shows_host_phases_and_the_wait():
  events = instance_events(STEPS[:2], [])
  host = [(e["name"], e["ts"], e["dur"]) for e in events if e.get("cat") == "host"]
  assert host[:3] == [("plan", -3000.0, 2000.0), ("dispatch", -1000.0, 1000.0),
                      ("readback", 97000.0, 3000.0)]
  waits = [(e["ts"], e["dur"]) for e in events if e.get("cat") == "host_wait"]
  assert waits == [(100000.0, 30000.0)]
  names = [e["args"]["name"] for e in events if e["ph"] == "M"]
  assert names == ["instances", "decode-0", "decode-0 host"]
