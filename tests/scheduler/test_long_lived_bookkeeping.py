"""What a long-lived driver keeps must not grow with its requests (issue 47, item 5): transfer
errors are counted under at most MAX_ERROR_REASONS texts (a reason's text can hold an epoch or
an address: one entry per failed attempt before); tenant flushes are spilled records in a
server, as the steps are; no request's recovery bookkeeping outlives it (checked at the end of
every run: it caught stale transfer attempts after a kill, keyed by id(request))."""

import dataclasses

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req
from pdjax.kv.transfer_result import TransferResult
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError
from pdjax.scheduler.spill import SpilledList
from pdjax.scheduler.transfers import MAX_ERROR_REASONS, OTHER_REASONS


def test_transfer_errors_are_counted_under_a_bounded_number_of_reasons():
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock, num_pages=256), FakeInstance("decode-0", clock)
  calls = []

  def failing(src, src_pages, dst, dst_pages):
    calls.append(1)
    if len(calls) <= 40:
      raise DeviceError(f"link reset at epoch {len(calls)}")   # a new text every attempt
    return TransferResult(bytes=1, seconds=0.0)

  opts = dataclasses.replace(OPTS, transfer_failure_policy="fail", transfer_retries=0)
  driver = Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                  options=opts, clock=clock, transfer_fn=failing)
  result = driver.run([_req(i, 4, 2) for i in range(44)])
  errors = result.faults["transfer_errors"]
  assert len(errors) == MAX_ERROR_REASONS + 1
  assert errors[OTHER_REASONS] == 40 - MAX_ERROR_REASONS
  assert errors["DeviceError: link reset at epoch 1"] == 1
  assert sum(errors.values()) == 40
  assert [r.status for r in result.requests].count(Status.FAILED) == 40
  assert driver._views._requests == {}        # no request's policy view outlives it


def test_a_server_driver_spills_its_flushes(tmp_path):
  clock = ManualClock()
  workers = [InstanceQueue(FakeInstance("colocated-0", clock), "colocated")]
  driver = Driver("colocated", workers, options=OPTS, clock=clock, spill_dir=str(tmp_path))
  assert isinstance(driver.flushes, SpilledList)
  for i in range(3):
    driver.flush_tenant(f"t{i}")
  assert [f["tenant"] for f in driver.flushes] == ["t0", "t1", "t2"]
