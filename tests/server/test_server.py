"""`python -m pdjax.serve` on SmolLM2-135M-Instruct (servers on 127.0.0.1, started and stopped
here): the OpenAI client's text, streamed or not, completions and chat, equals `pdjax.generate`
greedy, colocated and disaggregated; bad requests get their status while the server keeps
serving; 32 concurrent streams of which 8 disconnect; `pdjax.bench_serve` against the server;
shutdown writes the run's files, whose numbers match the last /metrics scrape.
The disaggregated tests run in file order (the last one stops its server)."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

PLAIN = ["The capital of France is", "def fibonacci(n):"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}]]
MAX_NEW = 16
# The stacked layout: these tests are about the server, and a TP1 CPU instance's default
# (unrolled, one program body per layer) compiles ~8 s slower per SmolLM2 instance; the
# unrolled layout's tokens are checked by tests/models/test_smollm2.py.
SMOKE = ["--config=configs/smollm2.py:smoke", "--config.scheduler.prefill_buckets=(256,)",
         "--config.scheduler.decode_buckets=(8,)", "--config.model.param_layout=stacked"]


class Server:
  def __init__(self, mode: str, folder: str, workdir: str):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.url, self.model, self.workdir = f"http://127.0.0.1:{self.port}", folder, workdir
    self.log = open(os.path.join(os.path.dirname(workdir), f"serve-{mode}.log"), "w")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "pdjax.serve", *SMOKE, f"--config.mode={mode}",
         f"--config.model.checkpoint={folder}", f"--port={self.port}", f"--workdir={workdir}",
         "--grace_s=5", f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
        stdout=self.log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while True:
      assert self.proc.poll() is None, self.output()
      try:
        if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
          break
      except httpx.HTTPError:
        pass
      assert time.monotonic() < deadline, "the server did not come up in 900 s"
      time.sleep(1)

  def output(self) -> str:
    self.log.flush()
    with open(self.log.name) as f:
      return f.read()[-3000:]

  def stop(self) -> int:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGINT)
      self.proc.wait(timeout=300)
    self.log.close()
    return self.proc.returncode


@pytest.fixture(scope="module")
def expected(smollm2, tmp_path_factory):
  """pdjax.generate's greedy answers: {"p0": (text, finish_reason), ..., "c0": ...}."""
  d = tmp_path_factory.mktemp("generate")
  rows = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PLAIN)]
  rows += [{"id": f"c{i}", "messages": m} for i, m in enumerate(CHATS)]
  (d / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.generate", f"--checkpoint={smollm2}",
       f"--prompts={d / 'in.jsonl'}", f"--max_new_tokens={MAX_NEW}", f"--output={d / 'out.jsonl'}",
       f"--compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = [json.loads(line) for line in (d / "out.jsonl").read_text().splitlines()]
  return {r["id"]: (r["text"], r["finish_reason"]) for r in out}


@pytest.fixture(scope="module", params=["colocated", "disaggregated"])
def any_server(request, smollm2, tmp_path_factory):
  server = Server(request.param, smollm2, str(tmp_path_factory.mktemp("serve") / "run"))
  yield server
  assert server.stop() == 0, server.output()


@pytest.fixture(scope="module")
def disagg(smollm2, tmp_path_factory):
  server = Server("disaggregated", smollm2, str(tmp_path_factory.mktemp("serve") / "run"))
  server.state = {}
  yield server
  server.stop()


def test_openai_client_text_equals_generate(any_server, expected):
  client = openai.OpenAI(base_url=f"{any_server.url}/v1", api_key="unused")
  for i, prompt in enumerate(PLAIN):
    text, reason = expected[f"p{i}"]
    c = client.completions.create(model=any_server.model, prompt=prompt, max_tokens=MAX_NEW,
                                  temperature=0)
    assert (c.choices[0].text, c.choices[0].finish_reason) == (text, reason)
    chunks = list(client.completions.create(model=any_server.model, prompt=prompt,
                                            max_tokens=MAX_NEW, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == reason
  for i, messages in enumerate(CHATS):
    text, reason = expected[f"c{i}"]
    c = client.chat.completions.create(model=any_server.model, messages=messages,
                                       max_tokens=MAX_NEW, temperature=0)
    assert (c.choices[0].message.content, c.choices[0].finish_reason) == (text, reason)
    stream = client.chat.completions.create(model=any_server.model, messages=messages,
                                            max_tokens=MAX_NEW, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].usage.completion_tokens == c.usage.completion_tokens


def test_bad_requests_get_their_status_and_the_server_keeps_serving(any_server, expected):
  url = f"{any_server.url}/v1/completions"
  r = httpx.post(url, content=b"{oops", timeout=30)
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
  cases = [({"model": "gpt-9", "prompt": "hi"},
            f"model 'gpt-9' is not served here (this server serves {any_server.model!r})"),
           ({"model": any_server.model, "prompt": ""}, "the prompt is empty"),
           ({"model": any_server.model, "prompt": [1] * 500, "max_tokens": 20},
            "prompt_len + max_tokens = 520 exceeds max_model_len = 512"),
           ({"model": any_server.model, "prompt": "hi", "best_of": 3},
            "unsupported parameter: 'best_of'")]
  for body, message in cases:
    r = httpx.post(url, json=body, timeout=30)
    assert (r.status_code, r.json()["error"]["message"]) == (400, message)
  r = httpx.post(url, json={"model": any_server.model, "prompt": PLAIN[0],
                            "max_tokens": MAX_NEW, "temperature": 0}, timeout=120)
  assert r.json()["choices"][0]["text"] == expected["p0"][0]


def test_32_streams_8_disconnect(disagg, expected):
  async def one(client, i):
    body = {"model": disagg.model, "prompt": PLAIN[0], "max_tokens": MAX_NEW,
            "temperature": 0, "stream": True}
    text, rid, chunks = "", None, 0
    async with client.stream("POST", f"{disagg.url}/v1/completions", json=body) as r:
      async for line in r.aiter_lines():
        if not line.startswith("data: {"):
          continue
        obj = json.loads(line[len("data: "):])
        rid = rid or obj["id"]
        text += obj["choices"][0]["text"]
        chunks += 1
        if i % 4 == 0 and chunks == 2:
          return rid, None        # leaves mid-stream: the response is closed
    return rid, text

  async def main():
    async with httpx.AsyncClient(timeout=600) as client:
      return await asyncio.gather(*(one(client, i) for i in range(32)))

  results = asyncio.run(main())
  left = [rid for rid, text in results if text is None]
  assert len(left) == 8 and len(set(rid for rid, _ in results)) == 32
  assert [text for _, text in results if text is not None] == [expected["p0"][0]] * 24
  disagg.state["disconnected"] = set(left)
  deadline = time.monotonic() + 60     # cancellations land within a few driver turns
  while True:
    m = _metrics(disagg)
    idle = (sum(m.get("pdjax:num_requests_running", {}).values()) == 0
            and sum(m.get("pdjax:kv_cache_usage_perc", {}).values()) == 0)
    if idle:
      break
    assert time.monotonic() < deadline, m
    time.sleep(0.2)


def test_bench_serve_against_the_server(disagg, smollm2, tmp_path):
  out = tmp_path / "bench.json"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.bench_serve", f"--base_url={disagg.url}",
       "--config=configs/smollm2.py:smoke", f"--config.model.checkpoint={smollm2}",
       # one request at a time (near-regular arrivals 2 s apart, each served in ~1 s): the
       # comparison measures the HTTP path, not two cores shared by XLA's threads, the
       # server's loop and the client (overlapping requests measured 12-22 ms there)
       "--config.workload.rate=0.5", "--config.workload.arrival=gamma",
       "--config.workload.burstiness=100", f"--output={out}"],
      capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  bench = json.loads(out.read_text())
  assert (bench["completed"], bench["failed"]) == (8, 0)
  disagg.state["bench"] = bench


def test_shutdown_writes_the_run_and_metrics_match_it(disagg):
  metrics = _metrics(disagg)
  assert disagg.stop() == 0, disagg.output()
  rows = {json.loads(l)["id"]: json.loads(l)
          for l in open(os.path.join(disagg.workdir, "requests.jsonl"))}
  summary = json.load(open(os.path.join(disagg.workdir, "summary.json")))
  assert summary["kv_pages_leaked"] == 0
  assert summary["run_info"]["workload"] == {"kind": "http", "requests": len(rows)}
  assert summary["run_info"]["placement"]["run"] == "disaggregated"
  assert summary["run_info"]["backend"]["name"] == "jax"
  cancelled = {rid for rid, r in rows.items() if r["status"] == "cancelled"}
  assert cancelled == disagg.state["disconnected"]
  assert {r["reason"] for rid, r in rows.items() if rid in cancelled} == {
      "cancelled by the client (client)"}
  by_status = metrics["pdjax:requests_terminal_total"]
  assert {dict(k)["status"]: v for k, v in by_status.items()} == {
      s: summary["requests"][s] for s in ("finished", "rejected", "failed", "cancelled")}
  ttft_count = sum(metrics["pdjax:time_to_first_token_seconds_count"].values())
  assert ttft_count == sum(1 for r in rows.values() if r["status"] == "finished")
  assert sum(metrics["pdjax:kv_transfer_bytes_sum"].values()) == summary["kv_transfer"]["bytes"]
  bench = disagg.state["bench"]
  # Joined by id, each client TTFT spans the server's (it starts before the server stamps the
  # arrival and ends after the token left); by how much depends on the machine's load (10-60
  # ms on the shared 2-core CPU), which a test must not assert.
  pairs = [(t, rows[rid]["ttft_s"]) for rid, t in zip(bench["request_ids"], bench["ttfts"])]
  assert len(pairs) == 8 and all(client >= server - 1e-3 for client, server in pairs), pairs


def _metrics(server) -> dict:
  """{sample name: {labels as a sorted tuple: value}} of one /metrics scrape."""
  text = httpx.get(f"{server.url}/metrics", timeout=30).text
  out: dict = {}
  for family in text_string_to_metric_families(text):
    for s in family.samples:
      labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
      out.setdefault(s.name, {})[labels] = s.value
  return out
