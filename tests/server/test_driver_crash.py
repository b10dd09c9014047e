"""Issue 25: a driver thread that crashes (a programming error, not a DeviceError) is logged
with its traceback, fails the requests it held (their handlers answer 500), turns /health to
500 with the error, and leaves a result to write; on the fake engine, no jax."""

import logging

from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.request import Status
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge

from helpers.fake_engine import OPTS, FakeInstance


class _Clock:
  def advance(self, seconds):
    pass


class BuggyInstance(FakeInstance):
  """Its decode step raises a programming error: the driver must not swallow it."""

  def decode(self, seqs):
    raise ZeroDivisionError("a bug in the decode step")


def _engine():
  inst = BuggyInstance("colocated-0", _Clock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  return DriverBridge("colocated", [inst], tokenizer=None, eos_ids=())


def test_a_driver_crash_is_logged_fails_its_requests_and_turns_health_500(caplog):
  engine = _engine()
  engine.start()
  app = make_app(engine, model_name="fake", max_model_len=OPTS.max_model_len, vocab_size=1000)
  with caplog.at_level(logging.ERROR, logger="pdjax.server.driver_bridge"), TestClient(app) as client:
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [5, 6, 7],
                                             "max_tokens": 4})
    assert r.status_code == 500
    assert r.json()["error"]["message"] == (
        "the engine stopped: ZeroDivisionError: a bug in the decode step")
    engine._thread.join(5)
    h = client.get("/health")
    assert (h.status_code, h.json()) == (
        500, {"status": "failed", "error": "ZeroDivisionError: a bug in the decode step"})
    r = client.post("/v1/completions", json={"model": "fake", "prompt": [5], "max_tokens": 1})
    assert (r.status_code, r.json()["error"]["message"]) == (   # (was 503 "shutting down")
        500, "the engine stopped: ZeroDivisionError: a bug in the decode step")
  crashes = [rec for rec in caplog.records if rec.name == "pdjax.server.driver_bridge"]
  assert len(crashes) == 1 and crashes[0].levelno == logging.ERROR
  text = crashes[0].getMessage()
  assert text.startswith("the driver thread died:\nTraceback (most recent call last):")
  assert "in decode" in text and text.endswith("ZeroDivisionError: a bug in the decode step")
  (req,) = engine.result.requests
  assert (req.status, req.reason, req.output_ids) == (
      Status.FAILED, "the engine stopped: ZeroDivisionError: a bug in the decode step", [103])
  assert isinstance(engine.error, ZeroDivisionError)


def test_the_http_server_stops_once_the_driver_crashed():
  """pdjax.serve's server ends its loop (then writes the run and exits non-zero) instead of
  answering 503 'shutting down' forever."""
  import asyncio
  import types

  import uvicorn

  from pdjax.server.http_server import DrainingServer
  engine = types.SimpleNamespace(error=None, alive=True, draining=False,
                                 live_requests=lambda: 0)
  server = DrainingServer(uvicorn.Config(lambda *_: None), engine, grace_s=30.0)
  assert asyncio.run(server.on_tick(0)) is False      # serving
  engine.error, engine.alive = ZeroDivisionError("a bug in the decode step"), False
  assert asyncio.run(server.on_tick(0)) is True       # stops, no signal needed
