"""The driver survives only the failures the design expects (DeviceError from a step or a
transfer, injected faults); a programming error propagates, and a run whose every transfer
fails with one and the same device error fails loudly instead of quietly recomputing."""

import dataclasses

import pytest

from helpers.fake_engine import OPTS, FakeInstance, FakePending, InstanceQueue, _req
from pdjax.kv.transfer_result import TransferResult
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError


def _disagg(transfer_fn, **opts):
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  options = dataclasses.replace(OPTS, transfer_backoff_s=0.001, **opts)
  return Driver("disaggregated", [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode")],
                options=options,
                clock=clock, transfer_fn=transfer_fn)


def test_a_bug_in_the_transfer_function_raises_instead_of_falling_back():
  def buggy(src, src_pages, dst, dst_pages):
    return src_pages + None          # a TypeError, as a wrong signature would give

  with pytest.raises(TypeError, match="can only concatenate list"):
    _disagg(buggy).run([_req(0, 4, 3), _req(1, 4, 3)])


def test_a_bug_in_a_step_raises():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  inst.decode = lambda seqs: FakePending(clock, 0.01, [], ValueError("30 exceeds the largest "
                                                                     "bucket 16"))
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    driver.run([_req(0, 4, 3)])


def test_every_transfer_failing_with_one_device_error_fails_the_run():
  def dead_link(*_):
    raise DeviceError("no route to decode-0")

  driver = _disagg(dead_link, transfer_retries=1)
  with pytest.raises(RuntimeError, match=r"^every KV transfer of the run failed \(4 attempts\), "
                                         r"all with: DeviceError: no route to decode-0$"):
    driver.run([_req(0, 4, 3), _req(1, 4, 3)])


def _fails_once():
  """A transfer function whose first attempt fails with a DeviceError; later ones land."""
  calls = []

  def transfer(*_):
    calls.append(1)
    if len(calls) == 1:
      raise DeviceError("link reset")
    return TransferResult(bytes=1, seconds=0.0)
  return transfer


def test_one_device_error_among_landed_transfers_is_recovered_quietly():
  flaky = _fails_once()
  a, b = _disagg(flaky).run([_req(0, 4, 3), _req(1, 4, 3)]).requests
  assert [r.status for r in (a, b)] == [Status.FINISHED] * 2
  assert a.output_ids == b.output_ids == [104, 105, 106] and a.fallbacks == []


@pytest.mark.parametrize("leak", [False, True])
def test_a_failed_transfer_gives_its_decode_slot_back(monkeypatch, leak):
  """One decode slot: the failed attempt must release its reservation, or the retry (and the
  other request) can never be placed and the run stalls. leak=True shows the test sees it."""
  from pdjax.scheduler.instance_queue import InstanceQueue as RealInstanceQueue
  if leak:
    monkeypatch.setattr(RealInstanceQueue, "release", lambda self, req: None)
  flaky = _fails_once()
  clock = ManualClock()
  p, d = FakeInstance("prefill-0", clock), FakeInstance("decode-0", clock)
  driver = Driver("disaggregated",
                  [InstanceQueue(p, "prefill"), InstanceQueue(d, "decode", max_batch=1)],
                  options=dataclasses.replace(OPTS, transfer_backoff_s=0.001), clock=clock,
                  transfer_fn=flaky)
  a, b = driver.run([_req(0, 4, 3), _req(1, 4, 3)]).requests
  expected = [Status.FAILED] * 2 if leak else [Status.FINISHED] * 2
  assert [a.status, b.status] == expected
  if not leak:
    assert a.output_ids == b.output_ids == [104, 105, 106]
