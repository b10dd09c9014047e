"""The engine-core process as the HTTP process sees it (EngineClient): the same interface as an
in-process DriverBridge (submit, cancel, draining, ready, alive, error, abort_all, detach,
flush_tenant, metrics_text, stop), over the pipe to engine_core.py's process. Pure Python:
this process never imports jax.

    HTTP handler ─submit─► writer thread ══ pipe ══► engine process (driver thread)
         ▲                                                    │ a turn's events, one message
         └── asyncio.Queue per request ◄── reader thread ◄════╛

Sends go through a writer thread (a signal handler may set `draining`, so nothing here takes
a lock to send); the reader thread hands each message's events to the handlers' loop in one
call. If the engine process dies, every request in flight ends with ("error", "the engine
stopped: EngineProcessDied: ..."), /health answers 500, and the server stops.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import queue
import threading
import time

from pdjax.server.engine_api import (Draining, EngineStopped, RemoteError, SharedCache,
                                     SharedWallClock, stopped_reason)
from pdjax.server.engine_core import engine_main
from pdjax.server.startup import StartupMirror

# How long stop() waits for the engine process to exit once it sent "finished" (or died).
EXIT_WAIT_S = 30.0


class RequestHandle:
  """A submitted request, as its handler holds it (for cancel)."""

  def __init__(self, key: int, rid: str):
    self.key, self.id, self.ended = key, rid, False


class EngineClient:

  def __init__(self, plan, *, tokenizer):
    """plan: what the engine process runs (engine_core.py); tokenizer: the HTTP process's
    own, for parsing prompts (None: token ids only)."""
    self.tokenizer = tokenizer
    self.clock = SharedWallClock(time.perf_counter())
    self.startup = StartupMirror()
    self.error: BaseException | None = None
    self.summary: dict | None = None   # what the engine process's plan.finish returned
    self._draining = False
    self._running = False            # between "configured" and the driver's end
    self._lock = threading.Lock()
    self._channels: dict[int, tuple] = {}   # key -> (loop, queue, handle)
    self._live: dict[int, RequestHandle] = {}
    self._calls: dict[int, tuple] = {}      # call id -> (loop, future)
    self._keys, self._call_ids = itertools.count(), itertools.count()
    self._configured = threading.Event()
    self.config_error: str | None = None
    self._finished = threading.Event()
    self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
    context = multiprocessing.get_context("spawn")   # never fork: the child builds XLA
    self._conn, child = context.Pipe()
    self.process = context.Process(target=engine_main, args=(child, plan, self.clock.t0),
                                   name="pdjax-engine-core")
    self._child_conn = child

  def start(self) -> None:
    """Starts the engine process and waits until it is configured (jax and the weights
    loaded): afterwards `config_error` says why it cannot serve (None: it is compiling)."""
    self.process.start()
    # (runs before multiprocessing's own exit handler, which would wait for the process: a
    # server that exits without stop() must not hang on its engine)
    atexit.register(self._kill)
    self._child_conn.close()
    threading.Thread(target=self._read, name="pdjax-link-reader", daemon=True).start()
    threading.Thread(target=self._write, name="pdjax-link-writer", daemon=True).start()
    self._configured.wait()

  @property
  def ready(self) -> bool:
    return self.startup.ready and self._running

  @property
  def alive(self) -> bool:
    """Whether the driver runs (or starts): false once it ended or its process died."""
    return self._running

  @property
  def draining(self) -> bool:
    return self._draining

  @draining.setter
  def draining(self, value: bool) -> None:   # (called from signal handlers: no locks)
    if value and not self._draining:
      self._outgoing.put(("drain",))
    self._draining = value

  # ---- handler side (the event loop) --------------------------------------------------------

  def submit(self, rid: str, g, queue_: asyncio.Queue, arrival_s: float | None = None):
    """As DriverBridge.submit: raises EngineStopped, or Draining while starting or after a
    signal; the request's events arrive on queue_."""
    if self.error is not None:
      raise EngineStopped(stopped_reason(self.error))
    if self._draining or not self.alive:
      raise Draining("the server is shutting down")
    if not self.ready:
      raise Draining(self.startup.waiting_message())
    arrival_s = self.clock.now() if arrival_s is None else arrival_s
    handle = RequestHandle(next(self._keys), rid)
    with self._lock:
      self._channels[handle.key] = (asyncio.get_running_loop(), queue_, handle)
      self._live[handle.key] = handle
    self._outgoing.put(("submit", handle.key, rid, g, arrival_s))
    return handle

  def cancel(self, handle: RequestHandle) -> None:
    """The client went away: the engine cancels the request."""
    if not handle.ended:
      self._outgoing.put(("cancel", handle.key))

  def live_requests(self) -> int:
    with self._lock:
      return len(self._live)

  async def flush_tenant(self, tenant: str) -> int:
    return await self._call("flush_tenant", tenant)

  async def metrics_text(self, metrics=None) -> tuple[bytes | str, str]:
    """/metrics' (body, content type), rendered in the engine process, where the requests
    end and the driver is (`metrics` is an in-process engine's: not used here)."""
    del metrics
    return await self._call("metrics", None)

  async def _call(self, name: str, arg):
    if self.error is not None or not self._running:
      raise EngineStopped(stopped_reason(self.error) if self.error else
                          "the engine is not running")
    call_id, loop = next(self._call_ids), asyncio.get_running_loop()
    future = loop.create_future()
    with self._lock:
      self._calls[call_id] = (loop, future)
    self._outgoing.put(("call", call_id, name, arg))
    return await future

  # ---- shutdown --------------------------------------------------------------------------------

  def abort_all(self) -> None:
    """Every request still live is cancelled (their handlers answer "abort")."""
    self._draining = True
    self._outgoing.put(("abort_all",))

  def detach(self) -> None:
    """The handlers' loop is about to close: nothing is handed to it any more."""
    with self._lock:
      self._channels.clear()

  def stop(self, grace_s: float = 0.0) -> dict | None:
    """Lets requests in flight finish for grace_s, cancels the rest, and waits for the engine
    process to write the run's outputs and exit; what its plan.finish returned (None: the
    process died first, `error` says how)."""
    self._draining = True
    self._outgoing.put(("stop", grace_s))
    self._finished.wait()
    self.close()
    return self.summary

  def close(self, wait_s: float = EXIT_WAIT_S) -> None:
    """Ends the link; an engine process still there after wait_s is killed."""
    self._outgoing.put(None)
    self.process.join(wait_s)
    self._kill()
    self._conn.close()

  def _kill(self) -> None:
    if self.process.is_alive():
      self.process.kill()
      self.process.join()

  # ---- the link's threads ----------------------------------------------------------------------

  def _write(self) -> None:
    while (message := self._outgoing.get()) is not None:
      try:
        self._conn.send(message)
      except (BrokenPipeError, ConnectionResetError, OSError):   # the process died: the
        return                                                   # reader reports it

  def _read(self) -> None:
    try:
      while True:
        try:
          message = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
          return
        getattr(self, "_on_" + message[0])(*message[1:])
    finally:   # (a bug here raises on: the link still ends, nobody waits on it forever)
      self._lost()

  def _on_configured(self) -> None:
    self._running = True
    self._configured.set()

  def _on_config_error(self, message: str) -> None:
    self.config_error = message
    self._configured.set()

  def _on_startup(self, body: dict, ready: bool) -> None:
    self.startup.update(body, ready)

  def _on_events(self, batch: list) -> None:
    by_loop: dict = {}
    with self._lock:
      for key, event in batch:
        channel = self._channels.get(key)
        if event[0] != "text":
          self._end(key)
        if channel is not None:
          loop, queue_, _ = channel
          by_loop.setdefault(loop, []).append((queue_, event))
    for loop, items in by_loop.items():
      _deliver_soon(loop, items)

  def _end(self, key: int) -> None:
    """(with the lock held) The request ended: no more events for it."""
    handle = self._live.pop(key, None)
    if handle is not None:
      handle.ended = True
    self._channels.pop(key, None)

  def _on_reply(self, call_id: int, value, kind: str | None, message: str | None) -> None:
    with self._lock:
      loop, future = self._calls.pop(call_id)
    error = (None if kind is None else SharedCache(message) if kind == SharedCache.__name__
             else RemoteError(kind, message))
    _resolve_soon(loop, future, value, error)

  def _on_driver_ended(self, kind: str | None, message: str | None, cancelled: bool) -> None:
    del cancelled   # (the summary says it)
    if kind is not None:
      self.error = RemoteError(kind, message)
    self._running = False
    self._fail_all(EngineStopped(stopped_reason(self.error) if self.error
                                 else "the engine stopped"))

  def _on_finished(self, summary: dict) -> None:
    self.summary = summary
    self._finished.set()

  def _lost(self) -> None:
    """The pipe closed: after "finished", the process exits; before, it died."""
    if not self._finished.is_set() and self.config_error is None:
      self.process.join(5.0)
      if self.error is None:
        self.error = RemoteError("EngineProcessDied", "the engine process exited with code "
                                 f"{self.process.exitcode}")
      self._running = False
      self._fail_all(EngineStopped(stopped_reason(self.error)))
    self._configured.set()
    self._finished.set()

  def _fail_all(self, error: EngineStopped) -> None:
    """Every request and call still waiting ends with `error`."""
    with self._lock:
      channels, calls = list(self._channels.values()), list(self._calls.values())
      for key in list(self._live):
        self._end(key)
      self._calls.clear()
    by_loop: dict = {}
    for loop, queue_, _ in channels:
      by_loop.setdefault(loop, []).append((queue_, ("error", str(error))))
    for loop, items in by_loop.items():
      _deliver_soon(loop, items)
    for loop, future in calls:
      _resolve_soon(loop, future, None, error)


def _soon(loop, fn) -> None:
  """fn() on the loop's thread; nothing once the loop closed (nobody listens)."""
  try:
    loop.call_soon_threadsafe(fn)
  except RuntimeError:   # "Event loop is closed": the server stopped meanwhile
    if not loop.is_closed():
      raise


def _deliver_soon(loop, items: list) -> None:
  """Puts each (queue, event) on the loop's thread, in one call."""
  def deliver():
    for queue_, event in items:
      queue_.put_nowait(event)
  _soon(loop, deliver)


def _resolve_soon(loop, future, value, error) -> None:
  def resolve():
    if future.done():   # (its caller was cancelled)
      return
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(value)
  _soon(loop, resolve)
