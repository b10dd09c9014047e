"""Shutdown of `python -m pdjax.serve` (the tiny preset's real engine, a server subprocess on
127.0.0.1, no tokenizer: token-id prompts): SIGINT with a long stream, a long non-streaming
request and a short stream in flight. While draining, new requests get 503 with Retry-After on
the still-open socket; the short stream finishes within --grace_s; then the long ones end with
finish_reason "abort" (the stream with its final chunk and [DONE]); the process writes the
run's files and exits 0. And, with fake instances: the driver keeps running, and is stopped
cleanly, after the handlers' event loop closed under a request in flight."""

import asyncio
import json
import os
import signal
import subprocess
import threading
import time

import httpx

from pdjax.engine.options import EngineOptions
from pdjax.request import Status
from pdjax.server.driver_bridge import DriverBridge
from pdjax.server.protocol import Generation

from helpers.fake_engine import OPTS, FakeInstance
from helpers.server_process import start_server

GRACE_S = 2.0
LONG = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2000, "ignore_eos": True}
SHORT = LONG | {"max_tokens": 100, "stream": True}   # ~0.3 s of decoding here
ARGS = ["--config=configs/default.py:smoke", "--config.kv.max_model_len=2048",
        "--config.kv.pages_per_instance=1024", f"--grace_s={GRACE_S}"]


def _start(workdir: str, log) -> tuple[subprocess.Popen, str]:
  return start_server(ARGS, workdir, log)


def test_sigint_drains_aborts_the_rest_and_writes_the_run(tmp_path):
  workdir = str(tmp_path / "run")
  log = open(tmp_path / "serve.log", "w")
  proc, url = _start(workdir, log)
  lines, short, whole, errors = [], [], [], []

  def stream(body, out):
    try:
      with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
          if line:
            out.append(line)
    except Exception as e:  # pylint: disable=broad-except  (asserted below)
      errors.append(repr(e))

  def post():
    try:
      whole.append(httpx.post(f"{url}/v1/completions", json=LONG, timeout=60))
    except Exception as e:  # pylint: disable=broad-except  (asserted below)
      errors.append(repr(e))

  threads = [threading.Thread(target=stream, args=(LONG | {"stream": True}, lines)),
             threading.Thread(target=post)]
  for t in threads:
    t.start()
  deadline = time.monotonic() + 60
  while len(lines) < 5:                       # the stream is under way
    assert time.monotonic() < deadline and not errors, (errors, open(log.name).read()[-3000:])
    time.sleep(0.01)
  threads.append(threading.Thread(target=stream, args=(SHORT, short)))
  threads[-1].start()
  while not short:
    assert time.monotonic() < deadline and not errors, (errors, open(log.name).read()[-3000:])
    time.sleep(0.01)
  short_at_signal = list(short)
  proc.send_signal(signal.SIGINT)
  signalled = time.monotonic()
  time.sleep(0.3)
  refused = httpx.post(f"{url}/v1/completions", json=LONG, timeout=10)   # a new connection
  health = httpx.get(f"{url}/health", timeout=10)
  for t in threads:
    t.join(timeout=60)
  rc = proc.wait(timeout=60)
  took = time.monotonic() - signalled
  log.close()
  output = open(log.name).read()[-3000:]
  assert (rc, errors) == (0, []), output
  assert took < GRACE_S + 5, (took, output)

  assert refused.status_code == 503, refused.text
  assert refused.json()["error"]["message"] == "the server is shutting down"
  assert int(refused.headers["retry-after"]) >= 1
  assert (health.status_code, health.json()) == (503, {"status": "draining"})
  assert int(health.headers["retry-after"]) >= 1

  assert lines[-1] == "data: [DONE]"
  chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
  assert all(c["object"] == "text_completion" for c in chunks), chunks[-1]
  assert [c["choices"][0]["finish_reason"] for c in chunks[-1:]] == ["abort"]
  assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
  streamed = sum(len(c["choices"][0].get("token_ids") or []) for c in chunks)
  assert 5 <= streamed < LONG["max_tokens"]

  assert "data: [DONE]" not in short_at_signal   # in flight at the signal...
  assert short[-1] == "data: [DONE]"             # ...finished within the grace period
  chunks = [json.loads(line[len("data: "):]) for line in short[:-1]]
  assert chunks[-1]["choices"][0]["finish_reason"] == "length"
  assert sum(len(c["choices"][0].get("token_ids") or []) for c in chunks) == 100

  (answer,) = whole
  assert answer.status_code == 200, answer.text
  choice = answer.json()["choices"][0]
  assert choice["finish_reason"] == "abort"
  assert 0 < len(choice["token_ids"]) < LONG["max_tokens"]
  assert answer.json()["usage"]["completion_tokens"] == len(choice["token_ids"])

  for name in ("requests.jsonl", "summary.json", "report.md", "trace.json"):
    assert os.path.isfile(os.path.join(workdir, name)), name
  rows = [json.loads(l) for l in open(os.path.join(workdir, "requests.jsonl"))]
  assert sorted(r["status"] for r in rows) == ["cancelled", "cancelled", "finished"]
  assert {r["reason"] for r in rows if r["status"] == "cancelled"} == {
      "cancelled by the client (shutdown)"}
  assert json.load(open(os.path.join(workdir, "summary.json")))["kv_pages_leaked"] == 0


class _SleepClock:
  """FakePending advances its clock by the step's cost (decode 0.01 s): here, really."""

  def advance(self, seconds):
    time.sleep(seconds)


def test_the_driver_never_sends_to_a_closed_loop():
  inst = FakeInstance("colocated-0", _SleepClock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  engine = DriverBridge("colocated", [inst], tokenizer=None, eos_ids=())
  engine.start()
  g = Generation(chat=False, prompt_ids=[1] * 4, max_tokens=20, temperature=0.0, top_p=1.0,
                 seed=None, stop=(), stream=True, include_usage=False, ignore_eos=True)

  async def handler():
    queue: asyncio.Queue = asyncio.Queue()
    req = engine.submit("r0", g, queue)
    assert (await queue.get())[:2] == ("text", "")
    return req

  req = asyncio.run(handler())     # the loop closes with ~19 tokens (0.19 s) still to come
  assert not req.status.terminal
  result = engine.stop(0.0)        # no "Event loop is closed" from the driver's thread
  assert list(result.requests) == [req]
  assert (req.status, req.reason) == (Status.CANCELLED, "cancelled by the client (shutdown)")
  assert inst.tables.num_used_pages == 0
