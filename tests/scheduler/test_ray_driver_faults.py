"""The Ray launcher's fault paths that the driver handles, on the fake engine (no Ray, no jax):
a restarted instance whose new process never comes up stays dead (issue 25), and the actor's
step ordering after a step that failed at dispatch (InstanceActor.step, driven without Ray)."""

import asyncio
import dataclasses
import logging

import pytest

from helpers import fake_engine as fe
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError, InstanceLost


class _FailedStart:
  """A new actor process that died while starting (what PendingStart.result raises then)."""

  def __init__(self, name, error):
    self.name, self.error = name, error

  def ready(self):
    return True

  def result(self):
    raise self.error


class _Restartable(fe.FakeInstance):
  """A fake instance in its own process: kill() ends it, restart() starts a new one that
  fails with `start_error` (or comes up)."""

  def __init__(self, name, clock, start_error=None):
    super().__init__(name, clock)
    self.start_error, self.kills, self.restarts = start_error, 0, 0

  def kill(self):
    self.kills += 1

  def restart(self):
    self.restarts += 1
    return _FailedStart(self.name, self.start_error)


def _colocated(start_error):
  clock = ManualClock()
  insts = [_Restartable(f"colocated-{i}", clock, start_error) for i in range(2)]
  workers = [fe.InstanceQueue(i, "colocated") for i in insts]
  spec = FaultSpec(kills=(("colocated-0", 0.0),), restart_s=0.05)
  driver = Driver("colocated", workers, options=dataclasses.replace(fe.OPTS, debug=True),
                  clock=clock, injector=FaultInjector(spec))
  reqs = [fe._req(i, 5, 4, arrival=0.3 * (i // 2)) for i in range(6)]
  return driver, insts, reqs


@pytest.mark.parametrize("error", [
    InstanceLost("colocated-0's process is gone: The actor died unexpectedly"),
    DeviceError("JaxRuntimeError: INTERNAL: no device"),
], ids=["process-died", "device-error-in-warm-up"])
def test_a_restart_whose_new_process_fails_leaves_the_instance_dead(caplog, error):
  """colocated-0 is killed at 0 and restarted at 0.05; the new process fails to start. The
  run goes on on colocated-1 (before the fix, the InstanceLost escaped Driver.run)."""
  driver, insts, reqs = _colocated(error)
  with caplog.at_level(logging.WARNING, logger="pdjax.scheduler.recovery"):
    result = driver.run(reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 6
  assert [r.output_ids for r in result.requests] == [[105, 106, 107, 108]] * 6
  assert {r.decode_instance for r in result.requests} == {"colocated-1"}
  assert insts[0].calls == [] and len(insts[1].calls) > 0
  w0 = driver.workers[0]
  assert w0.dead and driver.tier("colocated") == [driver.workers[1]]
  assert insts[0].restarts == 1 and insts[0].kills == 2   # the kill, then the failed start
  f = result.faults
  assert (f["instances_killed"], f["instances_restarted"], f["restarts_failed"]) == (1, 0, 1)
  assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
      ("pdjax.scheduler.recovery", "WARNING",
       f"colocated-0: its restart failed ({type(error).__name__}: {error}); the instance "
       f"stays dead")]
  for inst in insts:
    assert inst.tables.num_free_pages == inst.tables.allocator.num_pages


def test_a_restart_that_fails_with_a_bug_still_raises():
  """Only the failures the design expects are survived: a ValueError from the start (a bug)
  stops the run."""
  driver, _, reqs = _colocated(ValueError("a bug in the actor's start"))
  with pytest.raises(ValueError, match="a bug in the actor's start"):
    driver.run(reqs)


def test_a_successful_restart_still_counts_no_failure():
  driver, insts, reqs = _colocated(None)
  insts[0].restart = _Up
  result = driver.run(reqs)
  assert result.faults["instances_restarted"] == 1 and "restarts_failed" not in result.faults
  assert not driver.workers[0].dead


class _Up:
  def ready(self):
    return True

  def result(self):
    return None


# ---- InstanceActor.step after a step that failed at dispatch (no Ray: the coroutine alone) ---

class _Launch:
  """What Instance.prefill/decode return (the actor waits for result() off its loop)."""

  def __init__(self, tokens):
    self.tokens, self.build_s, self.dispatch_s = tokens, 0.0, 0.0

  def result(self):
    return self.tokens


class _FakeEngine:
  """An engine.Instance stand-in: decode number `fail_at` (0-based) raises DeviceError at
  dispatch, as a JaxRuntimeError in a launch does; records which steps ran and their prev."""

  compiles = compiles_from_cache = lazy_compiles = 0
  lazy_compile_s = 0.0

  def __init__(self, fail_at):
    self.fail_at, self.launched = fail_at, []

  def decode(self, seqs, prev=None):
    n = len(self.launched)
    self.launched.append((seqs, prev.tokens if prev is not None else None))
    if n == self.fail_at:
      raise DeviceError("JaxRuntimeError: INTERNAL: launch failed")
    return _Launch([100 + n])

  prefill = decode


def _actor(fail_at):
  from pdjax.distributed.actor import InstanceActor
  actor = InstanceActor.__new__(InstanceActor)   # its state without a device or a server
  actor.inst = _FakeEngine(fail_at)
  actor._next_seq, actor._turn, actor._last = 0, None, None
  actor._revoked = set()
  return actor


def test_a_step_taking_the_tokens_of_a_step_that_failed_at_dispatch_is_not_run():
  """Step 1 fails at dispatch; step 2 was dispatched ahead on its tokens: it is not run and
  says so (StepNotRun, a DeviceError) instead of a ValueError nothing catches; so is step 3,
  dispatched ahead on step 2; step 4 (no device tokens) runs."""
  from pdjax.errors import StepNotRun
  actor = _actor(fail_at=1)

  async def steps():
    calls = [actor.step(0, "decode", ["a"], None), actor.step(1, "decode", ["b"], 0),
             actor.step(2, "decode", ["c"], 1), actor.step(3, "decode", ["d"], 2),
             actor.step(4, "decode", ["e"], None)]
    return await asyncio.gather(*calls, return_exceptions=True)

  out = asyncio.run(steps())
  assert out[0]["tokens"] == [100]
  assert type(out[1]) is DeviceError and str(out[1]) == "JaxRuntimeError: INTERNAL: launch failed"
  assert [(type(e), str(e)) for e in out[2:4]] == [
      (StepNotRun, "step 2 was not run: step 1, whose tokens it takes, failed"),
      (StepNotRun, "step 3 was not run: step 2, whose tokens it takes, failed")]
  assert out[4]["tokens"] == [102]
  assert actor.inst.launched == [(["a"], None), (["b"], [100]), (["e"], None)]


def test_a_step_on_tokens_of_a_step_not_dispatched_last_is_still_a_bug():
  actor = _actor(fail_at=None)

  async def steps():
    return await asyncio.gather(actor.step(0, "decode", ["a"], None),
                                actor.step(1, "decode", ["b"], 7), return_exceptions=True)

  out = asyncio.run(steps())
  assert type(out[1]) is ValueError and "takes tokens of step 7" in str(out[1])
