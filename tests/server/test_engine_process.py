"""The server in two processes (issue 45), on fake instances (no jax): an engine-core process
spawned by EngineClient serves make_app's endpoints as an in-process DriverBridge does
(answers, start-up progress, metrics, tenant flush); the tokens of a decode step come back in
one message; a driver crash there, or the engine process killed, ends the requests in flight
with a 500 and turns /health 500; the engine process exits when the HTTP process dies."""

import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.server.app import make_app
from pdjax.server.engine_api import error_text
from pdjax.server.engine_client import EngineClient

from helpers.fake_engine import OPTS, FakeInstance

MODEL = "fake"
BODY = {"model": MODEL, "prompt": [1] * 4, "max_tokens": 8, "ignore_eos": True}


class _SleepClock:
  """Fake steps take their cost (decode 10 ms) times `scale`, really."""

  def __init__(self, scale: float):
    self.scale = scale

  def advance(self, seconds):
    time.sleep(seconds * self.scale)


class BuggyInstance(FakeInstance):
  def decode(self, seqs):
    raise ZeroDivisionError("a bug in the decode step")


class FakePlan:
  """engine_core's plan: one fake colocated instance, compiled in two 'programs' (waiting on
  `gate`, when given, before the second); pickled into the engine process."""

  def __init__(self, buggy: bool = False, gate=None, scale: float = 1.0):
    self.buggy, self.gate, self.scale = buggy, gate, scale

  def configure(self, startup):
    pass

  def session(self):
    return contextlib.nullcontext()

  def bridge_kwargs(self):
    from pdjax.server.prometheus import ServerMetrics
    return dict(tokenizer=None, eos_ids=(110,), metrics=ServerMetrics(model_name=MODEL))

  def build(self, startup):
    startup.begin("compiling programs")
    startup.program(1, 2, "program 1")
    if self.gate is not None:
      self.gate.wait(30)
    startup.program(2, 2, "program 2")
    inst = (BuggyInstance if self.buggy else FakeInstance)("colocated-0",
                                                           _SleepClock(self.scale), num_pages=32)
    inst.role = "colocated"
    inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                              prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
    return "colocated", [inst], {}

  def finish(self, bridge):
    result = bridge.result
    return {"served": bridge.driver is not None,
            "error": error_text(bridge.error) if bridge.error else None,
            "statuses": sorted(r.status.value for r in result.requests) if result else []}


def _app(engine):
  return make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len, vocab_size=1000)


def _started(plan) -> EngineClient:
  engine = EngineClient(plan, tokenizer=None)
  engine.start()
  assert engine.config_error is None and engine.error is None
  return engine


def _wait_for(check, timeout_s: float = 30.0):
  deadline = time.monotonic() + timeout_s
  while not (value := check()):
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.02)
  return value


def test_answers_metrics_and_flush_through_the_engine_process_a_step_per_message():
  engine = _started(FakePlan())
  batches = []
  on_events = engine._on_events
  engine._on_events = lambda batch: (batches.append(len(batch)), on_events(batch))
  app = _app(engine)
  _wait_for(lambda: engine.ready)

  async def four_at_once():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
      return await asyncio.gather(*(client.post("/v1/completions", json=BODY)
                                    for _ in range(4)))

  answers = asyncio.run(four_at_once())
  for r in answers:
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == list(range(104, 112))
  # 4 requests x (8 tokens + their end): the decode steps of 4 come back in one message each
  assert sum(batches) == 36 and max(batches) >= 4 and len(batches) <= 20, batches
  with TestClient(app) as client:
    with client.stream("POST", "/v1/completions", json=BODY | {"stream": True}) as s:
      lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 10
    metrics = client.get("/metrics").text
    assert f'pdjax:requests_terminal_total{{model_name="{MODEL}",status="finished"}} 5.0' in metrics
    assert client.post("/v1/kv/flush").json() == {"object": "kv.flush", "tenant": "", "pages": 0}
  engine.detach()
  assert engine.stop(1.0) == {"served": True, "error": None, "statuses": ["finished"] * 5}
  assert engine.process.exitcode == 0


def test_start_up_progress_comes_from_the_engine_process():
  gate = multiprocessing.get_context("spawn").Event()
  engine = _started(FakePlan(gate=gate))
  with TestClient(_app(engine)) as client:
    starting = {"status": "starting", "stage": "compiling programs", "done": 1, "total": 2}
    _wait_for(lambda: client.get("/health").json() == starting)
    r = client.post("/v1/completions", json=BODY)
    assert (r.status_code, r.json()["error"]["message"]) == (
        503, "the server is starting (compiling programs 1/2)")
    gate.set()
    _wait_for(lambda: client.get("/health").status_code == 200)
    assert client.post("/v1/completions", json=BODY).status_code == 200
  engine.detach()
  assert engine.stop(0.0)["statuses"] == ["finished"]


def test_a_driver_crash_in_the_engine_process_fails_its_requests_and_turns_health_500():
  engine = _started(FakePlan(buggy=True))
  message = "the engine stopped: ZeroDivisionError: a bug in the decode step"
  with TestClient(_app(engine)) as client:
    _wait_for(lambda: engine.ready)
    r = client.post("/v1/completions", json=BODY)
    assert (r.status_code, r.json()["error"]["message"]) == (500, message)
    _wait_for(lambda: engine.error is not None)
    h = client.get("/health")
    assert (h.status_code, h.json()) == (
        500, {"status": "failed", "error": "ZeroDivisionError: a bug in the decode step"})
    r = client.post("/v1/completions", json=BODY)
    assert (r.status_code, r.json()["error"]["message"]) == (500, message)
  engine.detach()
  assert engine.stop(0.0) == {"served": True, "error": "ZeroDivisionError: a bug in the "
                              "decode step", "statuses": ["failed"]}


def test_a_killed_engine_process_ends_the_requests_in_flight_with_500():
  engine = _started(FakePlan(scale=30.0))    # decode steps of 0.3 s
  answers = []
  with TestClient(_app(engine)) as client:
    _wait_for(lambda: engine.ready)
    asking = threading.Thread(target=lambda: answers.append(
        client.post("/v1/completions", json=BODY)))
    asking.start()
    _wait_for(lambda: engine.live_requests())
    time.sleep(0.5)
    os.kill(engine.process.pid, signal.SIGKILL)
    asking.join(30)
    message = "the engine stopped: EngineProcessDied: the engine process exited with code -9"
    (r,) = answers
    assert (r.status_code, r.json()["error"]["message"]) == (500, message)
    h = client.get("/health")
    assert (h.status_code, h.json()["error"]) == (
        500, "EngineProcessDied: the engine process exited with code -9")
    r = client.post("/v1/completions", json=BODY)
    assert (r.status_code, r.json()["error"]["message"]) == (500, message)
  assert (engine.alive, engine.live_requests()) == (False, 0)
  assert engine.stop(0.0) is None


HTTP_SIDE = """
import sys, time
from pdjax.server.engine_client import EngineClient
from test_engine_process import FakePlan
engine = EngineClient(FakePlan(), tokenizer=None)
engine.start()
print(engine.process.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] == "Z"   # exited, not yet reaped
  except FileNotFoundError:
    return True


def test_the_engine_process_exits_when_the_http_process_dies():
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
  http_side = subprocess.Popen([sys.executable, "-c", HTTP_SIDE], stdout=subprocess.PIPE,
                               text=True, env=env)
  try:
    pid = int(http_side.stdout.readline())
    assert not _gone(pid)
    http_side.kill()
    http_side.wait(30)
    _wait_for(lambda: _gone(pid), timeout_s=30)
  finally:
    http_side.kill()
    http_side.stdout.close()
