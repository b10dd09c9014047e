"""What other threads hand a running driver (a server's HTTP handlers): new requests,
client cancellations, and calls to run on the driver's own thread (a metrics snapshot).
Thread-safe; pure Python.

`Driver.run(..., inbox=inbox)` serves until the inbox is closed and every request it took has
ended: each loop turn takes what arrived (`take`), and an idle driver blocks in `wait` instead
of ending the run. A request is stamped with its arrival time by the submitting thread (the
run's clock is shared), so its queue time includes the hand-over.
"""

from __future__ import annotations

import concurrent.futures
import threading


class Inbox:

  def __init__(self):
    self._lock = threading.Lock()
    self._items: list[tuple[str, object]] = []
    self._ready = threading.Event()
    self._closed = False

  def submit(self, req) -> None:
    """A new request (its arrival_s already set on the run's clock)."""
    self._put("request", req)

  def cancel(self, req) -> None:
    """The client of req went away: Driver.cancel(req, "client")."""
    self._put("cancel", req)

  def call(self, fn) -> concurrent.futures.Future:
    """Runs fn(driver) on the driver's thread at the start of its next loop turn; the future
    holds its result (or exception)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._put("call", (fn, future))
    return future

  def close(self) -> None:
    """No more requests: the run ends once every request taken has ended."""
    with self._lock:
      self._closed = True
    self._ready.set()

  @property
  def closed(self) -> bool:
    with self._lock:
      return self._closed and not self._items

  def pending(self) -> bool:
    """Whether something waits to be taken."""
    with self._lock:
      return bool(self._items)

  def take(self) -> list[tuple[str, object]]:
    """What arrived since the last take. It also consumes the wake-up: after `close`, `wait`
    still blocks until something new arrives (a cancellation, a call) or its timeout, so a
    closed inbox does not spin a driver whose requests wait on timed events."""
    with self._lock:
      items, self._items = self._items, []
      self._ready.clear()
    return items

  def wait(self, timeout_s: float) -> None:
    """Blocks until something arrives, the inbox closes (once: the next `take` consumes it),
    or timeout_s."""
    self._ready.wait(max(timeout_s, 0.0))

  def _put(self, kind: str, payload) -> None:
    with self._lock:
      if self._closed and kind == "request":
        raise RuntimeError("the inbox is closed: the server is shutting down")
      self._items.append((kind, payload))
    self._ready.set()
