"""Online serving on the driver: requests, cancellations and calls handed over by another
thread through an Inbox, tokens and endings reported to a listener, the run ending only when
the inbox is closed. Fake instances, no jax."""

import threading
import time

import pytest

from pdjax.request import Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.scheduler.inbox import Inbox

from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req


class Listener:
  def __init__(self, stop_after: dict):
    self.events, self.stop_after = [], stop_after

  def on_token(self, req) -> bool:
    self.events.append((req.id, req.output_ids[-1]))
    return len(req.output_ids) == self.stop_after.get(req.id, -1)

  def on_finish(self, req) -> None:
    self.events.append((req.id, req.status.value))


def _until(pred, timeout_s=10.0):
  end = time.monotonic() + timeout_s
  while not pred():
    assert time.monotonic() < end, "timed out"
    time.sleep(0.001)


def test_inbox_feeds_a_running_driver_until_closed():
  clock = ManualClock()
  inst = FakeInstance("colocated-0", clock)
  driver = Driver("colocated", [InstanceQueue(inst, "colocated")], options=OPTS, clock=clock)
  inbox, listener, out = Inbox(), Listener({"r2": 2}), []
  thread = threading.Thread(target=lambda: out.append(driver.run([], inbox=inbox,
                                                                  listener=listener)))
  thread.start()
  r0 = _req(0, 5, 3, arrival=clock.now())
  inbox.submit(r0)
  _until(lambda: r0.status.terminal)
  assert thread.is_alive()                       # idle, not finished: the inbox is open
  assert inbox.call(lambda d: [w.name for w in d.workers]).result(timeout=10) == ["colocated-0"]
  r1, r2 = _req(1, 5, 15, arrival=clock.now()), _req(2, 4, 10, arrival=clock.now())
  inbox.submit(r1)
  inbox.cancel(r1)
  inbox.submit(r2)
  _until(lambda: r1.status.terminal and r2.status.terminal)
  inbox.close()
  thread.join(timeout=10)
  assert not thread.is_alive()
  (result,) = out
  assert result.requests == [r0, r1, r2]
  assert [r.status for r in result.requests] == [Status.FINISHED, Status.CANCELLED,
                                                 Status.FINISHED]
  assert r0.output_ids == [105, 106, 107]
  assert r1.reason == "cancelled by the client (client)"
  assert r2.output_ids == [104, 105]            # the listener stopped it after two tokens
  assert [e for e in listener.events if e[0] != "r1"] == [
      ("r0", 105), ("r0", 106), ("r0", 107), ("r0", "finished"),
      ("r2", 104), ("r2", 105), ("r2", "finished")]
  assert listener.events.count(("r1", "cancelled")) == 1
  assert inst.tables.num_used_pages == 0
  with pytest.raises(RuntimeError, match="the inbox is closed"):
    inbox.submit(_req(3, 4, 2))


def test_a_call_that_raises_hands_its_exception_back():
  clock = ManualClock()
  driver = Driver("colocated", [InstanceQueue(FakeInstance("colocated-0", clock), "colocated")],
                  options=OPTS, clock=clock)
  inbox = Inbox()
  thread = threading.Thread(target=lambda: driver.run([], inbox=inbox))
  thread.start()
  future = inbox.call(lambda d: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    future.result(timeout=10)
  inbox.close()
  thread.join(timeout=10)
  assert not thread.is_alive()


def test_a_closed_inbox_wakes_its_driver_once_then_waits():
  inbox = Inbox()
  inbox.close()
  start = time.monotonic()
  inbox.wait(5.0)                                # the close wakes a waiting driver at once
  assert time.monotonic() - start < 1.0
  assert inbox.take() == [] and inbox.closed
  start = time.monotonic()
  inbox.wait(0.3)                                # then it waits out its timeout: no spinning
  assert time.monotonic() - start >= 0.3
  req = _req(0, 4, 2)
  inbox.cancel(req)                              # ...unless something arrives
  start = time.monotonic()
  inbox.wait(5.0)
  assert time.monotonic() - start < 1.0
  assert inbox.take() == [("cancel", req)]
