"""Issue 25's fault paths, on the fake engine: a DeviceError while an evicted prefix page is
offloaded to the host tier (an eviction happens while the driver plans a step, outside the
step's own DeviceError guard) marks the instance dead and recomputes or fails its requests,
never crashing the run."""

from pdjax.kv.host_tier import HostTier
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req, ok_transfer


def _with_failing_offload(inst, tier):
  inst.tables.enable_prefix_cache()

  def offload(page, name, salt):
    raise DeviceError("the page gather failed")
  inst.tables.attach_host(tier, offload)
  return inst


def _reqs(n=2):
  # On a pool of 6 pages of 4 tokens, r0's 12-token prompt leaves 3 named pages cached; a
  # later 20-token prompt needs all 6 pages, so planning its prefill evicts them to the host
  # tier: the offload fails.
  reqs = [_req(0, 12, 1)] + [_req(i, 20, 1, arrival=float(i)) for i in range(1, n)]
  for i, r in enumerate(reqs[1:], 1):
    r.prompt_ids = [7 + i] * 20
  return reqs


def test_a_failed_offload_while_planning_kills_the_instance_and_fails_its_request():
  clock = ManualClock()
  inst = _with_failing_offload(FakeInstance("colocated-0", clock, num_pages=6), HostTier(16))
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  r0, r1 = driver.run(_reqs()).requests
  assert (r0.status, r0.output_ids) == (Status.FINISHED, [112])
  assert (r1.status, r1.reason) == (
      Status.FAILED, "colocated-0 died (host-tier offload failed: DeviceError: the page gather "
      "failed) and no live instance is left in the colocated tier")
  assert driver.workers[0].dead and driver.fault_counts["instances_killed"] == 1
  assert inst.calls == [("prefill", [12])]   # no step on the lost device
  assert inst.tables.num_used_pages == 0


def test_a_failed_offload_recomputes_the_request_on_a_live_instance():
  clock = ManualClock()
  tier = HostTier(16)
  bad = _with_failing_offload(FakeInstance("colocated-0", clock, num_pages=6), tier)
  good = FakeInstance("colocated-1", clock, num_pages=6)
  driver = Driver("colocated", [InstanceQueue(bad, "colocated"), InstanceQueue(good, "colocated")],
                  options=OPTS, clock=clock)
  # Placements alternate: r0 and r2 on colocated-0 (r2 evicts r0's pages there), r1 on
  # colocated-1.
  r0, r1, r2 = driver.run(_reqs(3)).requests
  assert [(r.status, r.output_ids) for r in (r0, r1, r2)] == [
      (Status.FINISHED, [112]), (Status.FINISHED, [120]), (Status.FINISHED, [120])]
  assert (r0.prefill_instance, r1.prefill_instance) == ("colocated-0", "colocated-1")
  assert (r2.prefill_instance, r2.fallbacks) == ("colocated-0", ["instance_died:rerouted"])
  assert bad.calls == [("prefill", [12])]   # r2's prefill ran on colocated-1, after r1's
  assert good.calls == [("prefill", [16]), ("prefill", [4])] * 2   # (a 16-token budget)
  assert driver.workers[0].dead and not driver.workers[1].dead
  assert driver.fault_counts["instances_killed"] == 1


def test_a_failed_offload_on_a_transfer_destination_sends_the_request_to_another():
  # Decode placements alternate: r0 on decode-1 (its pages stay cached there), r1 on
  # decode-0, r2 to decode-1, whose allocation evicts r0's pages: the offload fails.
  clock = ManualClock()
  good = FakeInstance("decode-0", clock, num_pages=6)
  bad = _with_failing_offload(FakeInstance("decode-1", clock, num_pages=6), HostTier(16))
  workers = [InstanceQueue(FakeInstance("prefill-0", clock), "prefill"),
             InstanceQueue(good, "decode"),
             InstanceQueue(bad, "decode")]
  driver = Driver("disaggregated", workers, options=OPTS, clock=clock, transfer_fn=ok_transfer)
  reqs = [_req(0, 12, 2)] + [_req(i, 20, 2, arrival=float(i)) for i in (1, 2)]
  for i, r in enumerate(reqs[1:], 1):
    r.prompt_ids = [7 + i] * 20
  r0, r1, r2 = driver.run(reqs).requests
  assert [(r.status, r.output_ids, r.decode_instance) for r in (r0, r1, r2)] == [
      (Status.FINISHED, [112, 113], "decode-1"), (Status.FINISHED, [120, 121], "decode-0"),
      (Status.FINISHED, [120, 121], "decode-0")]
  assert r2.fallbacks == []   # its prefill pages stayed: it moved to the live decode instance
  assert [w.dead for w in workers] == [False, False, True]
  assert bad.calls == [("decode", [12])] and good.calls == [("decode", [20])] * 2
  assert driver.fault_counts["instances_killed"] == 1
