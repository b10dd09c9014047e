"""An OpenAI-compatible HTTP server over the P/D engine.

  python -m pdjax.serve --config=configs/smollm2.py --host=127.0.0.1 --port=8000 \\
      [--config.mode=disaggregated] [--workdir=DIR] [--grace_s=30]

Serves the config's mode (colocated, disaggregated; colocated with
scheduler.colocated_policy=chunked_prefill for chunked prefill; compare, the shipped configs'
default, serves disaggregated) on the same instances, policies
and KV transfer as `pdjax.run`: POST /v1/completions and /v1/chat/completions (streaming or
not), GET /v1/models, /health and /metrics (Prometheus). The driver runs on the wall clock in
its own thread (pdjax/server/driver_bridge.py). SIGINT / SIGTERM: stop admitting (new requests, on the
socket kept open until the drain ends, get 503 with Retry-After), let requests in flight finish
for --grace_s, cancel the rest (streams end with finish_reason "abort" and [DONE], whole answers
with what they have; a second signal cancels at once), then write the run's
requests.jsonl, summary.json, report.md, trace.json and plots/ into --workdir as `pdjax.run`
does, and check the end-of-run invariants (every request terminal, every page back).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import sys
import time

import uvicorn
from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax.cli import define_config_and_workdir, fail, parse_flags, use_cpu_devices
from pdjax.runner.build import build_run, ray_cluster_for
from pdjax.runner.execute import run_info_of, summarize_run
from pdjax.runner.outputs import default_workdir, write_outputs

SWITCH_INTERVAL_S = 0.0005
# glibc gives each thread that contends for the heap its own arena (up to 8 per core), and
# memory freed in an arena stays with it: with the HTTP loop, the driver, the parsing threads
# and XLA's pools, resident memory crept up ~35 MiB over the first few thousand requests
# before it levelled off (benchmarks/server_soak.py); two arenas keep it flat.
MALLOC_ARENA_MAX = 2
# After the grace period: how long the cancelled requests' last events and the responses' last
# bytes may take before uvicorn cancels what is left.
DRAIN_TAIL_S = 5.0

CONFIG, WORKDIR = define_config_and_workdir()   # as pdjax.run's
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_GRACE = flags.DEFINE_float("grace_s", 30.0, "On shutdown, how long requests in flight may "
                            "still finish before they are cancelled.")
_NAME = flags.DEFINE_string("served_model_name", "", "The model id clients name; default: "
                            "model.checkpoint, else the preset name.")


def run_name(cfg) -> str:
  """The run served: colocated, chunked or disaggregated (mode=compare, the shipped configs'
  default, serves the disaggregated engine: one server runs one mode)."""
  if cfg.mode == "colocated" and cfg.scheduler.colocated_policy == "chunked_prefill":
    return "chunked"
  return "disaggregated" if cfg.mode == "compare" else cfg.mode


def limit_malloc_arenas(arenas: int = MALLOC_ARENA_MAX) -> bool:
  """mallopt(M_ARENA_MAX, arenas) on glibc, before the server's threads exist (the
  environment's MALLOC_ARENA_MAX, when set, wins). False where there is no glibc."""
  if "MALLOC_ARENA_MAX" in os.environ:
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:   # not glibc (macOS, musl): its allocator, its rules
    return False
  return bool(libc.mallopt(M_ARENA_MAX, arenas))


M_ARENA_MAX = -8   # glibc's malloc.h


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  limit_malloc_arenas()
  logging.set_verbosity(logging.WARNING)
  try:
    cfg = CONFIG.value
    cfg.mode  # a config file that failed to load raises here, on first use
  except OSError as e:
    fail(f"config error: cannot load --config: {e}")
  try:
    mcfg = config_lib.validate(cfg)
    if cfg.backend != "jax":
      raise config_lib.ConfigError(f"backend={cfg.backend!r}: the server needs the real engine "
                                   "(backend='jax')")
    use_cpu_devices(cfg.num_cpu_devices)
    import jax
    config_lib.validate(cfg, device_count=jax.device_count())
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  from pdjax.engine.cluster import enable_compile_cache, host_params
  from pdjax.text.stops import load_text
  from pdjax.text.tokenizer import TextError

  enable_compile_cache(cfg.compile_cache_dir)
  default = default_workdir(flags.FLAGS["config"].config_filename)
  workdir = WORKDIR.value or os.path.join(os.path.dirname(default),
                                          "serve-" + os.path.basename(default))
  from pdjax.server.startup import Startup
  startup = Startup()
  tokenizer, stop_ids = None, tuple(mcfg.eos_token_ids)
  try:
    if cfg.model.checkpoint or cfg.model.tokenizer:
      tokenizer, _, stop_ids = load_text(cfg.model.checkpoint, cfg.model.tokenizer, mcfg)
    params = None
    if config_lib.launcher(cfg) == "local" or cfg.debug:
      startup.begin("loading weights", cfg.model.checkpoint or
                    f"random {cfg.model.preset} weights, seed {cfg.seed}")
      params = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                           dtype=cfg.model.dtype)
      startup.end()
  except (TextError, KeyError, ValueError) as e:
    fail(f"config error: {e.args[0]}")
  name = _NAME.value or cfg.model.checkpoint or cfg.model.preset
  run = run_name(cfg)
  os.makedirs(workdir, exist_ok=True)
  with ray_cluster_for(cfg) as ray_cluster:
    engine = _serve(cfg, mcfg, run, params, ray_cluster, tokenizer, stop_ids, name, workdir,
                    startup)
    if engine.driver is None:    # stopped, or failed, before it was ready: nothing served
      engine.close()
      if engine.error is not None:
        sys.exit(f"the server failed to start: {type(engine.error).__name__}: {engine.error}")
      print("stopped while starting: nothing was served", flush=True)
      return
    result, error = engine.result, engine.error
    summary = summarize_run(cfg, run, result, engine.instances)
    summary["run_info"] = run_info_of(cfg, mcfg, run, workload={
        "kind": "http", "requests": len(result.requests)})
  write_outputs(workdir, cfg, run, summary, result, requests_written=True)
  engine.close()
  print(f"results: {workdir}", flush=True)
  if error is not None:   # written what it could; the crash is an error exit
    sys.exit(f"the engine stopped: {type(error).__name__}: {error}")


def _serve(cfg, mcfg, run, params, ray_cluster, tokenizer, stop_ids, name, workdir, startup):
  """Opens the HTTP server at once and builds the instances on the engine's thread (compiling:
  `startup` reports, /health says "starting"), serves until a signal, then drains. Returns
  the engine: its `result` (None when stopped before it was ready) and `error` (the driver
  thread's crash). requests.jsonl is written into workdir as requests end."""
  from pdjax.server import protocol
  from pdjax.server.app import make_app
  from pdjax.server.driver_bridge import DriverBridge
  from pdjax.server.prometheus import ServerMetrics

  # The driver thread and the HTTP event loop share the GIL: hand it over every 0.5 ms, not
  # Python's default 5 ms, so a token reaches its stream without waiting out a busy driver.
  sys.setswitchinterval(SWITCH_INTERVAL_S)

  def build():
    startup.begin("compiling programs")
    return build_run(cfg, mcfg, run, params, ray_cluster, progress=startup.program)

  metrics = ServerMetrics(model_name=name)
  engine = DriverBridge.starting(build, startup, tokenizer=tokenizer, eos_ids=stop_ids,
                                 metrics=metrics,
                                 requests_path=os.path.join(workdir, "requests.jsonl"))
  startup.cancelled = lambda: engine.draining   # a signal while compiling: stop there
  engine.start()
  web = make_app(engine, model_name=name, max_model_len=cfg.kv.max_model_len,
                 vocab_size=mcfg.vocab_size, metrics=metrics,
                 max_body_bytes=int(cfg.server.max_body_bytes),
                 api_keys=(protocol.load_api_keys(cfg.server.api_keys)
                           if cfg.server.get("api_keys") else None))
  web = _RetryAfter(web)
  web.server = server = _Server(
      uvicorn.Config(web, host=_HOST.value, port=_PORT.value, log_level="warning",
                     interface="asgi3", timeout_graceful_shutdown=DRAIN_TAIL_S),
      engine, _GRACE.value)
  print(f"serving {name!r} ({run}) on http://{_HOST.value}:{_PORT.value} (starting: GET "
        "/health answers 200 once ready)", flush=True)
  try:
    server.run()
  finally:
    engine.detach()       # the loop is closed: the driver must not send to it
  if engine.error is None:   # (a crash was logged, its requests failed: engine.result holds)
    engine.stop(0.0)         # drained by the server already: no second grace
  return engine


class _Server(uvicorn.Server):
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


class _RetryAfter:
  """ASGI middleware: while the server drains, every 503 carries Retry-After."""

  def __init__(self, app):
    self.app = app
    self.server: _Server | None = None   # set once the server is built

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


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
