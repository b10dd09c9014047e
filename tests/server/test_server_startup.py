"""Issue 25: a starting server reports its progress on stderr and through /health ("starting",
programs compiled of all) and refuses requests with 503 until it is ready; a shutdown signal
while it compiles stops the start-up; a start-up that fails turns /health 500. On the fake
engine (no jax), with a build function standing in for loading and compiling."""

import io
import threading

import pytest
from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge
from pdjax.server.startup import Startup, StartupCancelled

from helpers.fake_engine import OPTS, FakeInstance


class _Clock:
  def advance(self, seconds):
    pass


def _instance():
  inst = FakeInstance("colocated-0", _Clock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  return inst


class _Build:
  """Compiles 3 'programs', waiting before the third until `go` is set."""

  def __init__(self, startup: Startup, fail: Exception | None = None):
    self.startup, self.fail = startup, fail
    self.waiting, self.go = threading.Event(), threading.Event()

  def __call__(self):
    self.startup.begin("compiling programs")
    for i in (1, 2):
      self.startup.program(i, 3, f"program {i}")
    self.waiting.set()
    self.go.wait(10)
    if self.fail is not None:
      raise self.fail
    self.startup.program(3, 3, "program 3")
    return "colocated", [_instance()], {}


def _app(engine):
  return make_app(engine, model_name="fake", max_model_len=OPTS.max_model_len, vocab_size=1000)


def test_health_says_starting_and_requests_wait_for_ready():
  out = io.StringIO()
  startup = Startup(out=out)
  build = _Build(startup)
  engine = DriverBridge.starting(build, startup, tokenizer=None, eos_ids=())
  engine.start()
  assert build.waiting.wait(10)
  with TestClient(_app(engine)) as client:
    h = client.get("/health")
    assert (h.status_code, h.json()) == (503, {"status": "starting", "stage": "compiling programs",
                                               "done": 2, "total": 3})
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [5, 6], "max_tokens": 2})
    assert (r.status_code, r.json()["error"]["message"]) == (
        503, "the server is starting (compiling programs 2/3)")
    assert client.get("/metrics").status_code == 200      # no snapshot of a driver not there
    build.go.set()
    engine._ready_event.wait(10)
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [5, 6], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [102, 103]
  result = engine.stop(1.0)
  assert [q.status.value for q in result.requests] == ["finished"]
  lines = out.getvalue().splitlines()
  assert lines[0] == "startup: compiling programs"
  assert lines[1] == "startup: compiling programs 1/3 (program 1)"   # then a line a second
  assert lines[-2] == "startup: compiling programs 3/3 (program 3)"  # and the last
  assert lines[-1].startswith("startup: ready in ") and lines[-1].endswith(" s")


def test_a_shutdown_while_compiling_stops_the_start_up():
  startup = Startup(out=io.StringIO())
  build = _Build(startup)
  engine = DriverBridge.starting(build, startup, tokenizer=None, eos_ids=())
  startup.cancelled = lambda: engine.draining
  engine.start()
  assert build.waiting.wait(10)
  engine.draining = True        # the signal handler's first step
  build.go.set()                # the next program's progress sees it
  assert engine.stop(0.0) is None
  assert (engine.cancelled, engine.driver, engine.error) == (True, None, None)


def test_a_start_up_that_fails_turns_health_500():
  startup = Startup(out=io.StringIO())
  build = _Build(startup, fail=RuntimeError("out of device memory"))
  engine = DriverBridge.starting(build, startup, tokenizer=None, eos_ids=())
  engine.start()
  build.go.set()
  engine._thread.join(10)
  with TestClient(_app(engine)) as client:
    h = client.get("/health")
    assert (h.status_code, h.json()) == (
        500, {"status": "failed", "error": "RuntimeError: out of device memory"})
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [5], "max_tokens": 1})
    assert (r.status_code, r.json()["error"]["message"]) == (
        500, "the engine stopped: RuntimeError: out of device memory")
  with pytest.raises(RuntimeError, match="out of device memory"):
    engine.stop(0.0)


def test_startup_progress_lines_and_cancel():
  out, stop = io.StringIO(), [False]
  startup = Startup(out=out, cancelled=lambda: stop[0])
  startup.begin("loading weights", "random tiny weights, seed 0")
  startup.end()
  assert startup.describe() == {"status": "starting", "stage": "loading weights"}
  stop[0] = True
  with pytest.raises(StartupCancelled):
    startup.program(1, 4, "prefill-0 prefill, 64 tokens")
  lines = out.getvalue().splitlines()
  assert lines[0] == "startup: loading weights (random tiny weights, seed 0)"
  assert lines[1].startswith("startup: loading weights done in ")
