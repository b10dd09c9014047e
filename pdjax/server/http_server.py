"""pdjax.serve's HTTP server: the engine-core process started and served over HTTP
(serve_http), and uvicorn's server made to drain on a signal (DrainingServer, RetryAfter):
stop admitting (503 with Retry-After on the socket kept open), let requests in flight finish
for grace_s, cancel the rest (finish_reason "abort"), and only then close. Also what the
command sets up around it: the malloc arena cap and the name of the run served."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import sys
import time

import uvicorn

from pdjax.server import protocol
from pdjax.server.app import make_app
from pdjax.server.engine_api import SWITCH_INTERVAL_S

# glibc gives each thread that contends for the heap its own arena (up to 8 per core), and
# memory freed in an arena stays with it: with the HTTP loop, the driver, the parsing threads
# and XLA's pools, resident memory crept up ~35 MiB over the first few thousand requests
# before it levelled off (benchmarks/server_soak.py); two arenas keep it flat (set in both
# processes: mallopt here, the environment for the engine process).
MALLOC_ARENA_MAX = 2
# After the grace period: how long the cancelled requests' last events and the responses' last
# bytes may take before uvicorn cancels what is left.
DRAIN_TAIL_S = 5.0


def run_name(cfg) -> str:
  """The run served: colocated, chunked or disaggregated. mode=compare (the shipped configs'
  default) and compare_all serve the disaggregated engine: one server runs one mode
  (pdjax.serve refuses mode=hybrid)."""
  if cfg.mode == "colocated" and cfg.scheduler.colocated_policy == "chunked_prefill":
    return "chunked"
  return "disaggregated" if cfg.mode in ("compare", "compare_all") else cfg.mode


def limit_malloc_arenas(arenas: int = MALLOC_ARENA_MAX) -> bool:
  """mallopt(M_ARENA_MAX, arenas) on glibc, before the server's threads exist, and
  MALLOC_ARENA_MAX=arenas in the environment, which the engine process (spawned: a fresh glibc
  that reads it at its start) inherits (the environment's MALLOC_ARENA_MAX, when set, wins).
  False where there is no glibc."""
  if "MALLOC_ARENA_MAX" in os.environ:
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:   # not glibc (macOS, musl): its allocator, its rules
    return False
  os.environ["MALLOC_ARENA_MAX"] = str(arenas)
  return bool(libc.mallopt(M_ARENA_MAX, arenas))


M_ARENA_MAX = -8   # glibc's malloc.h


def serve_http(engine, cfg, mcfg, name: str, run: str, *, host: str, port: int,
               grace_s: float) -> None:
  """Serves the configured engine (an EngineClient whose process compiles meanwhile: /health
  says "starting") on host:port until a signal, then drains; the engine's process is then
  told to stop (engine.stop), which writes the run's outputs."""
  sys.setswitchinterval(SWITCH_INTERVAL_S)
  web = make_app(engine, model_name=name, max_model_len=cfg.kv.max_model_len,
                 vocab_size=mcfg.vocab_size, max_body_bytes=int(cfg.server.max_body_bytes),
                 api_keys=(protocol.load_api_keys(cfg.server.api_keys)
                           if cfg.server.get("api_keys") else None),
                 metrics_public=cfg.server.get("metrics_public", False))
  web = RetryAfter(web)
  web.server = server = DrainingServer(
      uvicorn.Config(web, host=host, port=port, log_level="warning",
                     interface="asgi3", timeout_graceful_shutdown=DRAIN_TAIL_S),
      engine, grace_s)
  print(f"serving {name!r} ({run}) on http://{host}:{port} (starting: GET "
        "/health answers 200 once ready)", flush=True)
  try:
    server.run()
  finally:
    engine.detach()       # the loop is closed: nothing is handed to it any more


class DrainingServer(uvicorn.Server):
  """uvicorn's server, draining on a signal before it stops: the engine stops admitting
  (503) while the listening socket stays open, requests in flight finish for grace_s, the
  rest are cancelled (answered with finish_reason "abort"); only once no request is live does
  uvicorn's own shutdown start (closing the socket, waiting DRAIN_TAIL_S for the responses)."""

  def __init__(self, config, engine, grace_s: float):
    super().__init__(config)
    self.engine, self.grace_s = engine, grace_s
    self.abort_at: float | None = None       # time.monotonic(): when live requests are cancelled
    self.aborted_at: float | None = None

  def handle_exit(self, sig, frame):
    if self.abort_at is None:
      self.engine.draining = True
      self.abort_at = time.monotonic() + self.grace_s
    elif self.aborted_at is None:            # a second signal: cancel now
      self.abort_at = time.monotonic()
    else:                                    # a third: stop without waiting for responses
      self.should_exit = self.force_exit = True

  def retry_after_s(self) -> int:
    """Seconds until this server is gone (a client retries elsewhere, or after a restart)."""
    end = (self.aborted_at or self.abort_at or time.monotonic()) + DRAIN_TAIL_S
    return max(1, math.ceil(end - time.monotonic()))

  async def on_tick(self, counter: int) -> bool:
    done = await super().on_tick(counter)
    if self.engine.error is not None:   # the driver thread crashed: stop (and exit non-zero)
      return True
    if done or self.abort_at is None:
      return done
    now = time.monotonic()
    if not self.engine.alive:
      return True
    if self.aborted_at is None and (not self.engine.live_requests() or now >= self.abort_at):
      self.engine.abort_all()
      self.aborted_at = now
    return self.aborted_at is not None and (
        not self.engine.live_requests() or now >= self.aborted_at + DRAIN_TAIL_S)

  async def shutdown(self, sockets=None):
    await super().shutdown(sockets)
    self.engine.detach()    # still on the loop: nothing is sent to it once it closes

  @contextlib.contextmanager
  def capture_signals(self):
    """SIGINT / SIGTERM start the shutdown (see handle_exit); unlike uvicorn's own,
    the signal is not re-raised afterwards: the run's files are still to be written."""
    previous = {sig: signal.signal(sig, self.handle_exit)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
      yield
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


class RetryAfter:
  """ASGI middleware: while the server drains, every 503 carries Retry-After."""

  def __init__(self, app):
    self.app = app
    self.server: DrainingServer | None = None   # set once the server is built

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http" or not self.server.engine.draining:
      return await self.app(scope, receive, send)

    async def send_retry_after(message):
      if message["type"] == "http.response.start" and message["status"] == 503:
        headers = [*message.get("headers", ()),
                   (b"retry-after", str(self.server.retry_after_s()).encode())]
        message = {**message, "headers": headers}
      await send(message)

    return await self.app(scope, receive, send_retry_after)
