"""The bridge between the HTTP server and the driver (DriverBridge): the pdjax driver running on
the wall clock in its own thread, fed through an Inbox, reporting each request's text back to
the asyncio loop of the HTTP handlers. Pure Python (instances are built by the caller; no jax here).

    HTTP handler ──submit(Request, Generation)──► Inbox ──► driver thread (Driver.run)
         ▲                                                        │ on_token / on_finish
         └──── asyncio.Queue per request ◄── loop.call_soon_threadsafe ┘

The events a handler receives are engine_api's (last: ("end", Outcome, ended by a stop
string)). In the engine-core process (engine_core.py) the same bridge sends each request's
events to the link back to the HTTP process instead (`submit_to` with a sink).
Draining (shutdown): no new request is taken (`draining`); `abort_all` cancels what is left
(reason "cancelled by the client (shutdown)"); `detach` drops every handler's queue before the
handlers' loop closes (the driver never touches a closed loop: sends happen under the lock that
`detach` takes); `stop` closes the inbox and joins the thread, which returns the RunResult.
Memory stays flat however long it serves: a request leaves the engine and the driver once it
ends (written to `requests_path`, one requests.jsonl line each, as it ends; the driver keeps
it, and its step, sample and transfer records, in files under a private folder: Driver's
spill_dir), so RunResult.requests holds them in the order they ended. `close` deletes that
folder once the run's outputs are written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import threading
import time
import traceback

from pdjax.runner import serve_requests
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.driver import RunResult
from pdjax.scheduler.clock import WallClock
from pdjax.scheduler.inbox import Inbox
from pdjax.server.engine_api import (Draining, EngineStopped, Outcome, SharedCache,
                                     stopped_reason)
from pdjax.server.startup import Startup, StartupCancelled
from pdjax.server.text_stream import CONTEXT_TOKENS, TextStream

logger = logging.getLogger(__name__)


class _Channel:
  """Where a request's events go: send(event), called with the engine's lock held (see
  DriverBridge.detach); and its text so far (None without a tokenizer)."""

  def __init__(self, send, stream: TextStream | None):
    self.send, self.stream = send, stream


def queue_sink(loop, queue: asyncio.Queue):
  """send(event) onto an asyncio queue from another thread."""
  def send(event) -> None:
    if not loop.is_closed():   # a loop closed under a detached engine: nobody listens
      loop.call_soon_threadsafe(queue.put_nowait, event)
  return send


class DriverBridge:

  def __init__(self, mode: str, instances: list, *, tokenizer, eos_ids: tuple[int, ...],
               metrics=None, requests_path: str | None = None, inbox: Inbox | None = None,
               clock: WallClock | None = None, on_exit=None, **serve_kwargs):
    """serve_kwargs: what serve_requests.make_driver takes besides the clock (policies, injector,
    transfer_fn, DriverOptions overrides). requests_path: where each request's requests.jsonl
    line is written as it ends (default: nowhere). inbox: the driver's (default a plain Inbox);
    clock: the run's (default a WallClock from now). on_exit(): called on the driver's thread
    as it ends (served, cancelled or crashed)."""
    self.mode, self.instances, self.tokenizer, self.eos_ids = mode, instances, tokenizer, eos_ids
    self.metrics = metrics
    self.clock = WallClock() if clock is None else clock
    self._spill = tempfile.TemporaryDirectory(prefix="pdjax-serve-")
    # (closed by close(), once the run's outputs are written)
    self._records = open(requests_path, "w") if requests_path else None  # pylint: disable=R1732
    self._serve_kwargs, self._build, self.startup = serve_kwargs, None, None
    self.driver = None if instances is None else self._make_driver()
    self.cancelled = False      # a shutdown came during start-up: nothing was served
    self._ready_event = threading.Event()   # set once ready (tests wait on it)
    if self.driver is not None:
      self._ready_event.set()
    self.inbox = Inbox() if inbox is None else inbox
    self._on_exit = on_exit
    self.draining = False
    self.result = None          # the RunResult, once the thread ended
    self.error: BaseException | None = None
    self._channels: dict[int, _Channel] = {}
    self._live: dict[int, Request] = {}   # submitted, not terminal yet
    self._aborts: list = []             # futures of abort_all's cancellations (checked by stop)
    self._lock = threading.Lock()
    self._thread = threading.Thread(target=self._run, name="pdjax-driver", daemon=True)

  @classmethod
  def starting(cls, build, startup: Startup, **kwargs) -> "DriverBridge":
    """An engine that builds its instances on its own thread, once started: build() ->
    (mode, instances, serve_kwargs) loads and compiles, reporting to `startup`. Until it
    returns the engine is not `ready`: a request is refused (503 "the server is starting"),
    /health says "starting" and how far; a shutdown meanwhile cancels the start-up."""
    engine = cls(None, None, **kwargs)
    engine._build, engine.startup = build, startup
    return engine

  def _make_driver(self):
    return serve_requests.make_driver(self.mode, self.instances, clock=self.clock,
                               spill_dir=self._spill.name, **self._serve_kwargs)

  @property
  def ready(self) -> bool:
    return self.driver is not None

  def start(self) -> None:
    self._thread.start()

  def _run(self) -> None:
    try:
      if self.driver is None:
        try:
          self.mode, self.instances, kwargs = self._build()
        except StartupCancelled:
          self.cancelled = True
          return
        self._serve_kwargs.update(kwargs)
        self.driver = self._make_driver()
        self.startup.finished()
        self._ready_event.set()
      self.result = self.driver.run([], inbox=self.inbox, listener=self)
      # (every instance the run used: a re-mesh may have replaced some)
      serve_requests.check_end_state(self.result, self.result.instances or self.instances)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised by stop())
      self._crashed(e)
    finally:
      if self._on_exit is not None:
        self._on_exit()

  def _crashed(self, e: BaseException) -> None:
    """The driver thread died: logged once with its traceback; every request not yet terminal
    fails with the reason (its handler answers 500); `result` holds what can still be written
    (the requests, the records so far). `/health` answers 500 and the server exits non-zero."""
    logger.error("the driver thread died:\n%s", "".join(traceback.format_exception(e)).rstrip())
    reason = stopped_reason(e)
    now = self.clock.now()
    d = self.driver
    if d is None:              # it died starting: nothing was served
      self.error = e
      return
    with self._lock:
      for req in self._live.values():   # (a terminal one: the driver kept it, on_finish died)
        if not req.status.terminal:
          req.finish(Status.FAILED, now, reason)
          d.requests.append(req)
        self._write(req)
      self._live.clear()
      for ch in self._channels.values():   # nobody waits forever on a driver that died
        ch.send(("error", reason))
      self.result = RunResult(d.requests, d.transfers, now, d.steps, d.samples,
                              d.role_switches, d.preemptions, d.flushes, tally=d.tally)
    self.error = e   # last: whoever sees it sees the failed requests and the result

  @property
  def alive(self) -> bool:
    return self._thread.is_alive()

  # ---- handler side (asyncio thread) --------------------------------------------------------

  def submit(self, rid: str, g, queue: asyncio.Queue, arrival_s: float | None = None) -> Request:
    """Hands a checked request (protocol.Generation) to the driver; its events arrive on
    `queue` (of the running loop). arrival_s: when the server received it (default now), on
    `clock`. Raises Draining once shutdown began, EngineStopped once the driver died."""
    return self.submit_to(rid, g, queue_sink(asyncio.get_running_loop(), queue), arrival_s)

  def submit_to(self, rid: str, g, send, arrival_s: float | None = None) -> Request:
    """submit, with the request's events handed to send(event) on the driver's thread."""
    if self.error is not None:
      raise EngineStopped(stopped_reason(self.error))
    if self.draining or not self.alive:
      raise Draining("the server is shutting down")
    if not self.ready:
      raise Draining(self.startup.waiting_message() if self.startup
                     else "the server is starting (starting)")
    arrival_s = self.clock.now() if arrival_s is None else arrival_s
    req = Request(id=rid, arrival_s=arrival_s, prompt_ids=list(g.prompt_ids),
                  sampling=SamplingParams(temperature=g.temperature, max_new_tokens=g.max_tokens,
                                          ignore_eos=g.ignore_eos, seed=g.seed, top_p=g.top_p),
                  eos_ids=() if g.ignore_eos else self.eos_ids, tenant=g.tenant,
                  cache_salt=g.cache_salt)
    stream = (TextStream(self.tokenizer, g.stop, req.eos_ids,
                         context=g.prompt_ids[-CONTEXT_TOKENS:]) if self.tokenizer else None)
    with self._lock:
      self._channels[id(req)] = _Channel(send, stream)
      self._live[id(req)] = req
    try:
      self.inbox.submit(req)
    except RuntimeError:
      with self._lock:
        del self._channels[id(req)], self._live[id(req)]
      raise Draining("the server is shutting down") from None
    return req

  def cancel(self, req: Request) -> None:
    """The client went away: the driver cancels req (pages freed on every tier)."""
    if not req.status.terminal:
      self.inbox.cancel(req)

  def live_requests(self) -> int:
    with self._lock:
      return len(self._live)

  async def flush_tenant(self, tenant: str) -> int:
    """POST /v1/kv/flush: the tenant's KV forgotten on the driver's thread; the pages.
    Raises SharedCache under kv.shared_salt (the driver's flush would forget every
    tenant's pages: an operator's kv.flush_tenants may, a tenant may not)."""
    def flush(driver) -> int:
      if driver.opts.shared_salt:
        raise SharedCache(SharedCache.MESSAGE)
      return driver.flush_tenant(tenant)
    return await asyncio.wrap_future(self.inbox.call(flush))

  async def metrics_text(self, metrics=None) -> tuple[bytes | str, str]:
    """GET /metrics: (body, content type) of `metrics` (default the engine's own), its
    gauges and counters updated from a snapshot taken on the driver's thread."""
    metrics = self.metrics if metrics is None else metrics
    if metrics is None:
      return "", "text/plain"
    if self.alive and self.ready:
      metrics.update(await asyncio.wrap_future(self.inbox.call(self.engine_state_of(metrics))))
    return metrics.render()

  @staticmethod
  def engine_state_of(metrics):
    """fn(driver) -> the EngineState `metrics` has not folded yet (for Inbox.call)."""
    from pdjax.server.prometheus import engine_state
    seen = metrics.transfers_seen()
    return lambda driver: engine_state(driver, seen)

  # ---- driver side (the driver's thread: Driver.run's listener) -------------------------------

  def on_token(self, req: Request) -> bool:
    with self._lock:
      ch = self._channels.get(id(req))
      if ch is None:
        return False
      if ch.stream is None:   # no tokenizer: the stream carries token ids (chunk "token_ids")
        if req.output_ids[-1] not in req.eos_ids:
          ch.send(("text", "", len(req.output_ids), [req.output_ids[-1]]))
        return False
      piece = ch.stream.add(req.output_ids[-1])
      if piece:
        ch.send(("text", piece, len(req.output_ids), None))
      return ch.stream.stopped

  def on_finish(self, req: Request) -> None:
    if self.metrics is not None:
      self.metrics.request_finished(req)
    with self._lock:
      self._live.pop(id(req), None)
      self._write(req)            # under the lock: a crash path sees it written or live
      ch = self._channels.pop(id(req), None)
      if ch is None:
        return
      rest = ch.stream.finish() if ch.stream else ""
      if rest:
        ch.send(("text", rest, len(req.output_ids), None))
      ch.send(("end", Outcome.of(req), bool(ch.stream and ch.stream.stopped)))

  def _write(self, req: Request) -> None:
    if self._records is not None:
      self._records.write(json.dumps(req.to_record()) + "\n")
      self._records.flush()     # a process killed outright still leaves its ended requests

  def ended_requests(self) -> list[Request]:
    """Every request that ended so far, in that order (read back from the driver's files, on
    its thread: for tests and debugging, not for a hot path)."""
    if self.driver is None:
      return []
    if not self.alive:
      return list(self.driver.requests)
    return self.inbox.call(lambda d: list(d.requests)).result(timeout=60)

  def close(self) -> None:
    """Deletes the driver's record files (after the run's outputs are written)."""
    if self._records is not None:
      self._records.close()
    self._spill.cleanup()

  # ---- shutdown --------------------------------------------------------------------------------

  def abort_all(self) -> None:
    """Shutdown: every request still live is cancelled (reason "cancelled by the client
    (shutdown)"); its handler gets its "end" event, and answers with finish_reason "abort"."""
    self.draining = True
    with self._lock:
      left = list(self._live.values())
    for req in left:
      self._aborts.append(self.inbox.call(lambda d, r=req: d.cancel(r, "shutdown")))

  def detach(self) -> None:
    """The handlers' loop is about to close: no event is sent to it any more."""
    with self._lock:
      self._channels.clear()

  def stop(self, grace_s: float = 0.0) -> object:
    """Stops taking requests, lets those in flight finish for up to grace_s (a server that
    drained already passes 0), cancels the rest, ends the driver's run and returns its
    RunResult (re-raising what stopped it, or a failed cancellation)."""
    self.draining = True
    deadline = self.clock.now() + grace_s
    while self.live_requests() and self.alive and self.clock.now() < deadline:
      time.sleep(0.05)
    self.abort_all()
    self.inbox.close()
    self._thread.join()
    if self.error is not None:
      raise self.error
    for future in self._aborts:
      future.result(timeout=0)   # run by the driver before it ended; re-raises its error
    return self.result
