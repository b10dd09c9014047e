"""The driver blocks on the engine's steps and transfers instead of polling them
(pdjax/engine/ready_wait.py): a wait ends when a pending lands, or after MAX_WAIT_S; a failed
step still wakes it; a real run never sleeps in the driver's poll."""

import threading
import time

import jax
import pytest

from conftest import tiny_engine_options
from pdjax.engine import ready_wait
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving
from pdjax.scheduler import waiting as waiting_lib


class Gate:
  """An array whose block_until_ready waits for `open` (or raises `error` then)."""

  def __init__(self, error=None):
    self.open, self.error = threading.Event(), error

  def block_until_ready(self):
    self.open.wait(10)
    if self.error:
      raise self.error


class FakePending:
  def __init__(self, *arrays):
    self.arrays = arrays

  def arrays_to_wait(self):
    return list(self.arrays)


def test_a_wait_ends_when_a_pending_lands_not_at_its_timeout(monkeypatch):
  monkeypatch.setattr(ready_wait, "MAX_WAIT_S", 30.0)
  gate = Gate()
  pending = FakePending(gate)
  threading.Timer(0.05, gate.open.set).start()
  t0 = time.perf_counter()
  ready_wait.wait_any([pending, FakePending(Gate())], timeout_s=30.0)
  assert time.perf_counter() - t0 < 10.0
  assert pending.landed_event is True


def test_a_pending_that_landed_before_the_wait_does_not_end_it(monkeypatch):
  """(A wrapped slow step whose arrays landed but whose stretched end is ahead: the driver
  must not spin.)"""
  monkeypatch.setattr(ready_wait, "MAX_WAIT_S", 0.2)
  gate = Gate()
  gate.open.set()
  pending = FakePending(gate)
  ready_wait.wait_any([pending], timeout_s=30.0)      # watched: lands during this wait
  t0 = time.perf_counter()
  ready_wait.wait_any([pending], timeout_s=30.0)
  assert time.perf_counter() - t0 >= 0.2


def test_a_failed_array_still_wakes_the_wait_and_raises_nothing_there(monkeypatch):
  """(A device failure: the driver's own ready()/result() raises it as DeviceError.)"""
  monkeypatch.setattr(ready_wait, "MAX_WAIT_S", 30.0)
  gate = Gate(error=jax.errors.JaxRuntimeError("device lost"))
  pending = FakePending(gate)
  threading.Timer(0.05, gate.open.set).start()
  ready_wait.wait_any([pending], timeout_s=30.0)
  assert pending.landed_event is True


class Broken:
  def arrays_to_wait(self):
    raise ValueError("arrays_to_wait is broken")


def test_a_bug_in_a_watcher_is_raised_by_the_wait_not_lost_in_its_thread(monkeypatch):
  monkeypatch.setattr(ready_wait, "MAX_WAIT_S", 30.0)
  with pytest.raises(ValueError, match="^arrays_to_wait is broken$"):
    ready_wait.wait_any([Broken()], timeout_s=30.0)


class CountingSleep:
  """The waiting module's `time`, counting sleeps (its poll when it cannot block)."""

  def __init__(self):
    self.sleeps = 0

  def sleep(self, s):
    self.sleeps += 1
    time.sleep(s)

  def __getattr__(self, name):
    return getattr(time, name)


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_an_engine_run_blocks_on_its_steps_and_transfers_never_polls(tiny_model, monkeypatch,
                                                                      mode):
  cfg, params = tiny_model
  layout = ([("colocated", 1, 1)] if mode == "colocated"
            else [("prefill", 1, 1), ("decode", 1, 1)])
  instances = build_instances(layout, cfg, params, tiny_engine_options())
  counting = CountingSleep()
  monkeypatch.setattr(waiting_lib, "time", counting)
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=list(range(3, 13 + i)),
                  sampling=SamplingParams(max_new_tokens=6, ignore_eos=True)) for i in range(3)]
  result = serving.serve(mode, instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 3
  assert [len(r.output_ids) for r in result.requests] == [6, 6, 6]
  assert counting.sleeps == 0
