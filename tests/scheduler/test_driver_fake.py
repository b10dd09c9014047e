"""The driver loop with fake instances and a manual clock: hand-checkable times and tokens.

Fake prefill takes 0.1 s and returns 100 + prompt length; fake decode takes 0.01 s and returns
last token + 1. Nothing here touches jax.
"""

import dataclasses

import pytest

from pdjax.kv.transfer_result import TransferResult
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req, ok_transfer  # noqa: F401


def test_colocated_single_request_times_and_tokens():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  (r,) = driver.run([_req(0, 5, 3, arrival=1.0)]).requests
  assert r.status == Status.FINISHED and r.output_ids == [105, 106, 107]
  assert r.token_times == pytest.approx([1.1, 1.11, 1.12])
  assert r.ttft_s == pytest.approx(0.1) and r.tpot_s == pytest.approx(0.01)
  assert inst.calls == [("prefill", [5]), ("decode", [5]), ("decode", [6])]
  assert inst.tables.num_used_pages == 0


def test_prefill_batches_under_token_budget_fcfs():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  reqs = [_req(0, 6, 1), _req(1, 6, 1), _req(2, 6, 1), _req(3, 2, 1)]
  driver.run(reqs)
  # 6+6 fit in 16; the third (6) does not, and r3 is not allowed to overtake it.
  assert inst.calls == [("prefill", [6, 6]), ("prefill", [6, 2])]
  assert [r.output_ids for r in reqs] == [[106], [106], [106], [102]]


def test_disaggregated_moves_pages_then_frees_prefill_side():
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  moves = []

  def transfer(src, src_pages, dst, dst_pages):
    moves.append((src.name, list(src_pages), dst.name, list(dst_pages)))
    clock.advance(0.005)
    return TransferResult(bytes=4096, seconds=0.005)

  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=OPTS,
                  clock=clock, transfer_fn=transfer)
  (r,) = driver.run([_req(0, 9, 3)]).requests
  # 9 prompt tokens = 3 pages on P; 12 tokens reserved on D = 3 pages, the first 3 receive KV.
  assert moves == [("prefill-0", [0, 1, 2], "decode-0", [0, 1, 2])]
  assert r.output_ids == [109, 110, 111]
  assert (r.prefill_instance, r.decode_instance, r.transfer_bytes) == ("prefill-0", "decode-0",
                                                                       4096)
  assert r.token_times == pytest.approx([0.1, 0.115, 0.125])
  assert driver.transfers == [{"bytes": 4096, "seconds": 0.005, "ok": True}]
  assert p.tables.num_used_pages == 0 and d.tables.num_used_pages == 0


def test_transfer_failure_fails_only_that_request_and_frees_pages():
  """With transfer_failure_policy=fail and no retries, a failed transfer fails its request."""
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  calls = []

  def flaky(src, src_pages, dst, dst_pages):
    calls.append(1)
    if len(calls) == 1:
      raise DeviceError("link down")
    return TransferResult(bytes=1, seconds=0.0)

  opts = dataclasses.replace(OPTS, transfer_failure_policy="fail", transfer_retries=0)
  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")], options=opts,
                  clock=clock, transfer_fn=flaky)
  a, b = driver.run([_req(0, 4, 3), _req(1, 4, 3)]).requests
  assert (a.status, a.reason) == (Status.FAILED, "kv transfer failed after 1 attempt(s): "
                                                 "prefill-0->decode-0: DeviceError: link down")
  assert b.status == Status.FINISHED and b.output_ids == [104, 105, 106]
  assert [t["ok"] for t in driver.transfers] == [False, True]
  assert p.tables.num_used_pages == 0 and d.tables.num_used_pages == 0


def test_failed_step_fails_its_batch_not_the_run():
  clock = ManualClock()
  bad = FakeInstance("colocated-0", clock, fail_prefill=True)
  good = FakeInstance("colocated-1", clock)
  driver = Driver("colocated", [InstanceQueue(bad, "colocated"), InstanceQueue(good, "colocated")],
                  options=OPTS, clock=clock)
  a, b = driver.run([_req(0, 4, 2), _req(1, 4, 2)]).requests   # least loaded: one each
  assert (a.status, a.reason) == (Status.FAILED, "prefill step failed on colocated-0: "
                                                 "DeviceError: device lost")
  assert b.status == Status.FINISHED and b.output_ids == [104, 105]
  assert bad.tables.num_used_pages == 0 and good.tables.num_used_pages == 0


def test_rejections_are_terminal_with_reasons():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  reqs = [_req(0, 0, 2), _req(1, 20, 5), _req(2, 17, 1), _req(3, 3, 2)]
  driver.run(reqs)
  assert [(r.status.value, r.reason) for r in reqs] == [
      ("rejected", "empty prompt"),
      ("rejected", "prompt_len + max_new_tokens = 25 exceeds max_model_len = 24"),
      ("finished", ""),   # longer than the 16-token budget: prefilled alone, in two pieces
      ("finished", ""),
  ]
  assert reqs[2].output_ids == [117] and inst.calls[:2] == [("prefill", [16]), ("prefill", [1, 3])]


def test_eos_stops_generation():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  (r,) = driver.run([_req(0, 4, 16, eos=(106,))]).requests
  assert r.output_ids == [104, 105, 106] and r.status == Status.FINISHED


def test_kv_pressure_preempts_newest_and_recomputes_it():
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock, num_pages=4)
  ok = lambda *a: TransferResult(bytes=1, seconds=0.0)
  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=OPTS,
                  clock=clock, transfer_fn=ok)
  # Decode pool: 4 pages x 4 tokens. Both requests arrive with 2 pages (prompt 4 + first
  # slot); at position 8 the first needs a third page, so the newest (r1) is preempted, waits,
  # and is recomputed on the decode instance (prompt + its tokens but the last) once r0 ends.
  a, b = driver.run([_req(0, 4, 8), _req(1, 4, 8)]).requests
  assert a.output_ids == b.output_ids == list(range(104, 112))
  assert (a.preemptions, b.preemptions, driver.preemptions) == (0, 1, 1)
  recompute = [c for c in d.calls if c[0] == "prefill"]
  assert recompute == [("prefill", [4 + 4])]   # r1 had 5 tokens when preempted at position 8
  assert b.finish_s > a.finish_s
  assert p.tables.num_used_pages == 0 and d.tables.num_used_pages == 0


def test_least_loaded_router_spreads_requests():
  clock = ManualClock()
  insts = [FakeInstance(f"colocated-{i}", clock) for i in range(3)]
  driver = Driver("colocated", [InstanceQueue(i, "colocated") for i in insts], options=OPTS,
                  clock=clock)
  reqs = driver.run([_req(i, 4, 1) for i in range(6)]).requests
  # Each arrival sees the others equally loaded: ties rotate, from colocated-1 for seed 0.
  assert [r.prefill_instance for r in reqs] == ["colocated-1", "colocated-2", "colocated-0"] * 2


def test_a_transfer_in_flight_does_not_hold_the_loop():
  """r0's transfer is dispatched but lands only after 40 polls; r1's lands at once and decodes
  meanwhile: the loop kept stepping while r0's pages were moving."""
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  R = TransferResult

  class Landing:
    polls = 0

    def ready(self):
      self.polls += 1
      return self.polls > 40

    def result(self):
      return R(bytes=1, seconds=0.0)

  calls = []

  def transfer(src, src_pages, dst, dst_pages):
    calls.append(1)
    return Landing() if len(calls) == 1 else R(bytes=1, seconds=0.0)

  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=OPTS,
                  clock=clock, transfer_fn=transfer)
  a, b = driver.run([_req(0, 4, 6), _req(1, 4, 6)]).requests
  assert a.status == b.status == Status.FINISHED
  assert b.decode_start_s < a.decode_start_s       # b decoded while a's pages moved
  assert len([t for t in b.token_times if t < a.transfer_end_s]) >= 3
  assert p.tables.num_used_pages == 0 and d.tables.num_used_pages == 0


def test_source_pages_are_freed_only_after_the_landing_is_observed():
  """Each transfer lands only on its 4th poll. The log orders the transfer's dispatch, the
  first poll that sees it landed, its result() and every free on the prefill instance: each
  request's source pages are freed once, after its landing was seen and its result read, and
  at every poll before that the prefill instance still held exactly the pages being moved."""
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  R = TransferResult
  log, in_flight = [], []
  free = p.tables.free

  def logged_free(seq_id, now=0.0):
    log.append(("free", seq_id))
    free(seq_id, now)

  p.tables.free = logged_free
  reqs = [_req(0, 4, 3), _req(1, 5, 3)]

  class Landing:
    def __init__(self, rid, pages):
      self.rid, self.pages, self.polls, self.landed = rid, pages, 0, False

    def ready(self):
      self.polls += 1
      if self.polls <= 3:
        in_flight.append((self.rid, self.rid in p.tables and
                          p.tables.block_table(self.rid) == self.pages))
        return False
      if not self.landed:
        self.landed = True
        log.append(("landed", self.rid))
      return True

    def result(self):
      log.append(("result", self.rid))
      return R(bytes=1, seconds=0.0)

  def transfer(src, src_pages, dst, dst_pages):
    rid = next(r.id for r in reqs if r.id in p.tables and p.tables.block_table(r.id) == src_pages)
    log.append(("dispatch", rid))
    return Landing(rid, list(src_pages))

  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=OPTS,
                  clock=clock, transfer_fn=transfer)
  a, b = driver.run(reqs).requests
  assert (a.status, a.output_ids) == (Status.FINISHED, [104, 105, 106])
  assert (b.status, b.output_ids) == (Status.FINISHED, [105, 106, 107])
  for rid in ("r0", "r1"):
    events = [e for e, i in log if i == rid]
    assert events == ["dispatch", "landed", "result", "free"], rid
    assert [held for i, held in in_flight if i == rid] == [True] * 3, rid
  assert p.tables.num_used_pages == 0 and d.tables.num_used_pages == 0


def test_a_step_that_never_completes_ends_in_a_dead_instance_not_a_hang():
  """A device that stops answering (its step never ready) is treated as dead after
  step_timeout_s of wall time: with no other instance the request fails with the reason."""
  import time as _time
  from helpers.fake_engine import FakePending
  from pdjax.scheduler.clock import WallClock

  class Hung(FakePending):
    def ready(self):
      return False

  class HungInstance(FakeInstance):
    def prefill(self, seqs):
      return Hung(self.clock, 0.0, [0] * len(seqs))

  clock = WallClock()
  inst = HungInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], clock=clock,
                  options=dataclasses.replace(OPTS, step_timeout_s=0.05))
  t0 = _time.perf_counter()
  result = driver.run([_req(0, 5, 3)])
  assert _time.perf_counter() - t0 < 5
  [r] = result.requests
  assert r.status is Status.FAILED
  assert r.reason == ("colocated-0 hung (a step not done in 0.05 s) and no live instance is "
                      "left in the colocated tier")
  assert result.faults["instances_killed"] == 1 and "kill_instance" not in result.faults[
      "injected"]
  assert inst.tables.num_free_pages == inst.tables.allocator.num_pages


def test_an_instance_idle_most_of_the_run_reports_a_queued_mean_near_0():
  """State is sampled when it changes (a request queued, a step collected), not only at
  dispatch: the queue a prefill empties counts for the prefill's 0.1 s, not for the idle gap
  after it. One instance: r0 queued at 0 (prefilled 0-0.1, its one token ends it), r1 at 9.9
  (9.9-10.0); queued 1 for 0.2 s of the 10 s run."""
  from pdjax.metrics.timeline import tier_stats
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  result = driver.run([_req(0, 5, 1), _req(1, 5, 1, arrival=9.9)])
  assert [(s["t"], s["queued"], s["running"], s["kv_pages_used"]) for s in result.samples] == [
      (0.0, 1, 0, 2), (0.1, 0, 0, 0), (9.9, 1, 0, 2), (pytest.approx(10.0), 0, 0, 0)]
  assert result.duration_s == pytest.approx(10.0)
  stats = tier_stats(result.steps, result.samples, result.duration_s)["instances"]
  assert stats["colocated-0"]["queued"] == {"mean": pytest.approx(0.02, rel=1e-12), "max": 1}
  assert stats["colocated-0"]["kv_used_frac_mean"] == pytest.approx(0.2 * 2 / 32 / 10, rel=1e-12)
