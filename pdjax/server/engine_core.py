"""The engine-core process of `python -m pdjax.serve`: the driver (a DriverBridge's thread and
the engine instances) in a process of its own, so that JSON, SSE and asyncio in the HTTP
process never hold the GIL the driver's loop needs (vLLM V1's API server / EngineCore split).
EngineClient (engine_client.py) starts it with the spawn context and talks to it over one
multiprocessing Pipe, in pickled tuples:

  HTTP -> engine   ("submit", key, request id, protocol.Generation, arrival_s),
                   ("cancel", key), ("call", call id, "metrics" | "flush_tenant", argument),
                   ("drain",), ("abort_all",), ("stop", grace_s)
  engine -> HTTP   ("configured",) or ("config_error", message): jax and the weights loaded;
                   ("startup", /health's starting body, ready): each start-up step;
                   ("events", [(key, event), ...]): engine_api's events of one driver turn
                   (a decode step's tokens of every request, one message);
                   ("reply", call id, value, error kind, error message);
                   ("driver_ended", error kind, error message, cancelled);
                   ("finished", what plan.finish returned): the run's outputs are written.

What the process runs comes from a plan (serve_plan.ServePlan for pdjax.serve; tests pass
fake ones): configure(startup), session() (a context around serving: the Ray cluster),
bridge_kwargs(), build(startup) -> (mode, instances, serve kwargs), finish(bridge) -> dict.
The process ignores SIGINT and SIGTERM (the HTTP process drains, then sends "stop") and ends
when the HTTP process dies (the pipe's end of file): its requests are cancelled and nothing
but requests.jsonl's lines is written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading

from pdjax.scheduler.inbox import Inbox
from pdjax.server.driver_bridge import DriverBridge
from pdjax.server.engine_api import (Draining, EngineStopped, PlanError, SharedWallClock,
                                     SWITCH_INTERVAL_S)
from pdjax.server.startup import Startup

# After the HTTP process died: how long the driver may take to end before the process exits
# without it.
ORPHAN_EXIT_S = 30.0


def engine_main(conn, plan, t0: float) -> None:
  """The spawned process's target: serves `plan` over `conn` on a clock whose zero is t0."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  sys.setswitchinterval(SWITCH_INTERVAL_S)
  logging.basicConfig(level=logging.WARNING)
  EngineCore(conn, plan, t0).run()


class FlushingInbox(Inbox):
  """The driver's inbox, sending the events its last turn produced before it takes what
  arrived (each loop turn) or waits for it (an idle driver): one message per turn."""

  def __init__(self, flush):
    super().__init__()
    self._flush = flush

  def take(self):
    self._flush()
    return super().take()

  def wait(self, timeout_s: float) -> None:
    self._flush()
    super().wait(timeout_s)


class EngineCore:
  """The engine process's side of the link: its reader thread turns messages into the
  bridge's calls; the driver's thread queues each request's events, sent once a turn."""

  def __init__(self, conn, plan, t0: float):
    self.conn, self.plan, self.t0 = conn, plan, t0
    self.bridge: DriverBridge | None = None
    self.draining = False
    self._send_lock = threading.Lock()
    self._outbox: list = []
    self._outbox_lock = threading.Lock()
    self._requests: dict = {}     # key -> live Request
    self._stop = threading.Event()
    self._grace_s = 0.0
    self._orphaned = False

  def run(self) -> None:
    threading.Thread(target=self._listen, name="pdjax-engine-link", daemon=True).start()
    startup = Startup(cancelled=lambda: self.draining,
                      watch=lambda body, ready: self._send(("startup", body, ready)))
    try:
      self.plan.configure(startup)
    except PlanError as e:
      self._send(("config_error", str(e)))
      return
    with self.plan.session():
      self.bridge = DriverBridge.starting(
          lambda: self.plan.build(startup), startup, inbox=FlushingInbox(self.flush),
          clock=SharedWallClock(self.t0), on_exit=self._driver_ended,
          **self.plan.bridge_kwargs())
      self.bridge.draining = self.draining
      self._send(("configured",))
      self.bridge.start()
      self._stop.wait()
      self._stop_bridge()
      summary = {} if self._orphaned else self.plan.finish(self.bridge)
    self.bridge.close()
    if not self._orphaned:
      self._send(("finished", summary))

  def _stop_bridge(self) -> None:
    try:
      self.bridge.stop(self._grace_s)
    except BaseException as e:  # pylint: disable=broad-except
      if e is not self.bridge.error:   # the driver's crash: logged and reported already
        raise

  # ---- to the HTTP process ---------------------------------------------------------------------

  def _send(self, message) -> None:
    if self._orphaned:
      return
    try:
      with self._send_lock:
        self.conn.send(message)
    except (BrokenPipeError, ConnectionResetError):   # the HTTP process is gone
      self._orphan()

  def _sink(self, key: int):
    """A request's events: queued for the next flush (on the driver's thread)."""
    def send(event) -> None:
      with self._outbox_lock:
        self._outbox.append((key, event))
      if event[0] != "text":
        self._requests.pop(key, None)
    return send

  def flush(self) -> None:
    """Sends the queued events in one message."""
    with self._outbox_lock:
      batch, self._outbox = self._outbox, []
    if batch:
      self._send(("events", batch))

  def _driver_ended(self) -> None:
    """The bridge's on_exit, on the driver's thread: its last events, then why it ended."""
    self.flush()
    e = self.bridge.error
    self._send(("driver_ended", type(e).__name__ if e else None, str(e) if e else None,
                self.bridge.cancelled))

  # ---- from the HTTP process -------------------------------------------------------------------

  def _listen(self) -> None:
    while True:
      try:
        message = self.conn.recv()
      except (EOFError, ConnectionResetError):   # the HTTP process is gone
        self._orphan()
        return
      kind, args = message[0], message[1:]
      if kind == "submit":
        self._submit(*args)
      elif kind == "cancel":
        req = self._requests.get(args[0])
        if req is not None:
          self.bridge.cancel(req)
      elif kind == "call":
        threading.Thread(target=self._call, args=args, name="pdjax-engine-call",
                         daemon=True).start()
      elif kind == "drain":
        self._drain()
      elif kind == "abort_all":
        self._drain()
        self.bridge.abort_all()
      elif kind == "stop":
        self._grace_s = args[0]
        self._stop.set()
      else:
        raise ValueError(f"unknown message from the HTTP process: {kind!r}")

  def _submit(self, key: int, rid: str, g, arrival_s: float) -> None:
    try:
      req = self.bridge.submit_to(rid, g, self._sink(key), arrival_s)
    except EngineStopped as e:
      self._answer(key, ("error", str(e)))
      return
    except Draining as e:
      self._answer(key, ("refused", str(e)))
      return
    self._requests[key] = req
    if req.status.terminal:   # ended before it was filed here: its sink found nothing to drop
      self._requests.pop(key, None)

  def _answer(self, key: int, event) -> None:
    self._sink(key)(event)
    self.flush()

  def _call(self, call_id: int, name: str, arg) -> None:
    """A call's answer, computed on its own thread (the driver's part runs on the driver's
    thread): an error in it is the caller's to raise."""
    try:
      if name == "metrics":
        value = asyncio.run(self.bridge.metrics_text())
      elif name == "flush_tenant":
        value = asyncio.run(self.bridge.flush_tenant(arg))
      else:
        raise ValueError(f"unknown call {name!r}")
    except Exception as e:  # pylint: disable=broad-except  (re-raised in the HTTP process)
      self._send(("reply", call_id, None, type(e).__name__, str(e)))
    else:
      self._send(("reply", call_id, value, None, None))

  def _drain(self) -> None:
    self.draining = True   # a start-up in progress stops at its next step
    if self.bridge is not None:
      self.bridge.draining = True

  def _orphan(self) -> None:
    """The HTTP process died: cancel everything, end the driver, exit (ORPHAN_EXIT_S at
    most)."""
    if self._orphaned:
      return
    self._orphaned = True
    if self.bridge is None:   # still configuring: nothing started to end
      os._exit(1)
    timer = threading.Timer(ORPHAN_EXIT_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    self._drain()
    self.bridge.abort_all()
    self._stop.set()
