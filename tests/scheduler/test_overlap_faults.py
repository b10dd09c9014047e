"""Overlap meets a device failure (issue 25): in a Ray actor a step that fails at dispatch is
seen by the driver only when it collects it, after it dispatched the next step ahead on that
step's device tokens. The actor does not run that step (StepNotRun, see
pdjax/distributed/actor.py); the driver fails the failed step's requests, plans the other
requests of the step not run again, and dispatches nothing more ahead of it. On the fake
engine, whose steps behave as the actor's do."""

import dataclasses

from helpers import fake_engine as fe
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError, StepNotRun

LAUNCH_FAILED = DeviceError("JaxRuntimeError: INTERNAL: launch failed")


class ActorLikeFake(fe.FakeInstance):
  """The fake engine with device tokens, its steps failing as an actor's do: the step
  numbered `fail_at` (0-based, every kind) fails at dispatch, which the driver sees at its
  collection; a step dispatched on the tokens of a failed step raises StepNotRun."""

  device_tokens = True

  def __init__(self, name, clock, fail_at):
    super().__init__(name, clock)
    self.fail_at, self.log = fail_at, []

  def prefill(self, seqs, prev=None):
    return self._step(super().prefill(seqs), seqs, prev)

  def decode(self, seqs, prev=None):
    return self._step(super().decode(seqs), seqs, prev)

  def _step(self, pending, seqs, prev):
    n = len(self.log)
    if prev is not None and prev.error is not None:
      pending.error = StepNotRun(f"step {n} was not run: step {n - 1}, whose tokens it takes, "
                                 f"failed")
    elif n == self.fail_at:
      pending.error = LAUNCH_FAILED
    self.log.append((self.calls[-1][0], len(seqs), prev is not None,
                     type(pending.error).__name__ if pending.error else None))
    return pending


def _serve(fail_at):
  clock = ManualClock()
  inst = ActorLikeFake("colocated-0", clock, fail_at)
  driver = Driver("colocated", [fe.InstanceQueue(inst, "colocated")],
                  options=dataclasses.replace(fe.OPTS, overlap=True, debug=True), clock=clock)
  reqs = [fe._req(0, 3, 12), fe._req(1, 3, 12), fe._req(2, 6, 5, arrival=0.13)]
  return driver.run(reqs), inst


def test_a_step_failing_at_dispatch_fails_its_requests_and_the_step_ahead_is_planned_again():
  """Step 4 (decode r0, r1) fails at dispatch; step 5 (r2's prompt, dispatched ahead on step
  4's tokens) is not run: r0 and r1 fail with the device error, r2 is prefilled again (step 6)
  and finishes with its tokens; nothing more went ahead of step 5."""
  result, inst = _serve(fail_at=4)
  r0, r1, r2 = result.requests
  why = "decode step failed on colocated-0: DeviceError: JaxRuntimeError: INTERNAL: launch failed"
  assert [(r.status, r.reason, r.output_ids) for r in (r0, r1)] == [
      (Status.FAILED, why, [103, 104, 105, 106])] * 2
  assert (r2.status, r2.reason, r2.output_ids) == (Status.FINISHED, "", [106, 107, 108, 109, 110])
  assert inst.log[3:7] == [("decode", 2, True, None), ("decode", 2, True, "DeviceError"),
                           ("prefill", 1, True, "StepNotRun"), ("prefill", 1, False, None)]
  assert result.faults["steps_not_run"] == 1
  assert [s["kind"] for s in result.steps].count("prefill") == 2   # the step not run: no record
  assert inst.tables.num_free_pages == inst.tables.allocator.num_pages


def test_a_failed_step_ahead_of_another_fails_alone():
  """The prefill dispatched ahead (r2's) fails: only r2 fails; r0 and r1, decoding in the step
  before it, finish, and no step is counted as not run."""
  result, inst = _serve(fail_at=5)
  r0, r1, r2 = result.requests
  assert [(r.status, r.output_ids) for r in (r0, r1)] == [
      (Status.FINISHED, list(range(103, 115)))] * 2
  assert (r2.status, r2.reason) == (
      Status.FAILED,
      "prefill step failed on colocated-0: DeviceError: JaxRuntimeError: INTERNAL: launch failed")
  assert "steps_not_run" not in result.faults
  assert inst.tables.num_free_pages == inst.tables.allocator.num_pages
