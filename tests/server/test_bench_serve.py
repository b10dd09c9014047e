"""pdjax.bench_serve against a fake OpenAI-compatible SSE server on localhost: exact counts,
ids that join client and server records, 429s as failures, wall-clock replay, latencies no
shorter than the server's injected sleeps, and the CLI (result JSON, one-line config errors)."""

import http.server
import json
import subprocess
import sys
import threading
import time

import pytest

from pdjax.client import bench as bench_serve
from pdjax import config as config_lib
from pdjax.models.llama_config import PRESETS

FIRST_DELAY_S = 0.05   # the fake server's sleep before its first chunk
GAP_S = 0.01           # and between chunks
MAX_CHUNKS = 6         # it streams min(max_tokens, MAX_CHUNKS) content chunks


class FakeServer(http.server.ThreadingHTTPServer):
  """An OpenAI-compatible streaming server: /v1/models lists "fake-model"; a completion streams
  min(max_tokens, MAX_CHUNKS) chunks of one word after FIRST_DELAY_S, GAP_S apart, then a usage
  chunk (completion_tokens = max_tokens) unless `usage` is off, then [DONE]. Prompts (as JSON
  text) in `reject` get a 429. `records` maps each response id to what the server saw."""

  daemon_threads = True

  def __init__(self, usage=True, reject=()):
    super().__init__(("127.0.0.1", 0), Handler)
    self.usage, self.reject = usage, set(reject)
    self.records, self.lock = {}, threading.Lock()
    self.inflight = self.max_inflight = 0   # requests being streamed now / at most

  @property
  def url(self):
    return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
  """Serves FakeServer's requests (HTTP/1.0: a stream ends when the connection closes)."""

  def log_message(self, *args):
    pass

  def _send(self, status, body):
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):
    if self.path == "/v1/models":
      self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
    else:
      self._send(404, {"error": "not found"})

  def do_POST(self):
    received = time.perf_counter()
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    prompt = body["messages"][0]["content"] if "messages" in body else body["prompt"]
    server = self.server
    if json.dumps(prompt) in server.reject:
      self._send(429, {"error": {"message": "too many requests", "code": 429}})
      return
    with server.lock:
      rid = f"cmpl-{len(server.records)}"
      server.records[rid] = dict(path=self.path, body=body, prompt=prompt, received=received)
      server.inflight += 1
      server.max_inflight = max(server.max_inflight, server.inflight)
    try:
      self._stream(rid, body, prompt)
    finally:
      with server.lock:
        server.inflight -= 1

  def _stream(self, rid, body, prompt):
    server = self.server
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.end_headers()
    chat = self.path == "/v1/chat/completions"

    def event(chunk):
      self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
      self.wfile.flush()

    if chat:   # a role-only first delta, as OpenAI servers send: not content
      event({"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    time.sleep(FIRST_DELAY_S)
    n = min(body["max_tokens"], MAX_CHUNKS)
    for i in range(n):
      if i:
        time.sleep(GAP_S)
      choice = ({"index": 0, "delta": {"content": f" w{i}"}} if chat
                else {"index": 0, "text": f" w{i}"})
      choice["finish_reason"] = "length" if i == n - 1 else None
      event({"id": rid, "object": "text_completion", "choices": [choice]})
    if server.usage:
      # A chat's prompt tokens include its template's: 100 more than the content's ids here.
      prompt_tokens = len(prompt) + (100 if chat else 0)
      event({"id": rid, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                  "completion_tokens": body["max_tokens"]}})
    self.wfile.write(b"data: [DONE]\n\n")
    self.wfile.flush()


@pytest.fixture
def serve():
  """serve(**kwargs) starts a FakeServer in a background thread; all are shut at the end."""
  servers = []

  def start(**kwargs):
    server = FakeServer(**kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return server

  yield start
  for server in servers:
    server.shutdown()
    server.server_close()


def _smoke(num_requests=6):
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.workload.num_requests = num_requests
  requests, _ = bench_serve.load_requests(cfg)
  assert len(requests) == num_requests
  return requests


def test_counts_ids_replay_and_latencies(serve):
  server = serve()
  requests = _smoke()
  before = time.perf_counter()   # the server runs in this process: one clock
  result = bench_serve.run_benchmark(server.url, requests, slo_ttft_s=10.0, slo_tpot_s=10.0)
  max_new = [r.sampling.max_new_tokens for r in requests]
  assert (result["completed"], result["failed"], result["num_prompts"]) == (6, 0, 6)
  assert result["model_id"] == "fake-model"
  assert result["input_lens"] == [len(r.prompt_ids) for r in requests]
  assert result["total_input_tokens"] == sum(len(r.prompt_ids) for r in requests)
  assert result["output_lens"] == max_new   # usage wins over the chunk count
  assert result["total_output_tokens"] == sum(max_new)
  assert result["errors"] == [""] * 6
  assert result["request_goodput"] == pytest.approx(result["request_throughput"])
  # Client and server records join on the id: each id's request carried that prompt.
  assert sorted(result["request_ids"]) == sorted(server.records)
  for r, rid in zip(requests, result["request_ids"]):
    seen = server.records[rid]
    assert seen["path"] == "/v1/completions" and seen["prompt"] == r.prompt_ids
    assert seen["body"]["max_tokens"] == r.sampling.max_new_tokens
    assert seen["body"]["model"] == "fake-model" and seen["body"]["stream"] is True
    assert seen["body"]["ignore_eos"] is True
  # Arrivals replayed on the wall clock: each was sent no earlier than its arrival_s, and
  # (in order) not much later either.
  for r, rid, sent in zip(requests, result["request_ids"], result["send_times"]):
    assert r.arrival_s - 1e-3 <= sent < r.arrival_s + 1.0
    assert server.records[rid]["received"] >= before + r.arrival_s
  assert result["duration"] >= requests[-1].arrival_s + FIRST_DELAY_S
  # Latencies are no shorter than what the server slept (and not absurdly longer).
  for ttft, itl, e2el, n in zip(result["ttfts"], result["itls"], result["e2els"], max_new):
    chunks = min(n, MAX_CHUNKS)
    assert FIRST_DELAY_S <= ttft < FIRST_DELAY_S + 2.0
    assert len(itl) == chunks - 1
    assert e2el >= FIRST_DELAY_S + GAP_S * (chunks - 1) - 1e-3
    assert sum(itl) == pytest.approx(e2el - ttft)
  assert result["median_itl_ms"] >= GAP_S * 1000 * 0.5
  assert result["mean_ttft_ms"] >= FIRST_DELAY_S * 1000
  for m in bench_serve.METRICS:
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
      assert result[f"{stat}_{m}_ms"] >= 0
  tpot = [(e - t) / (n - 1) for t, e, n in zip(result["ttfts"], result["e2els"], max_new)
          if n > 1]
  assert result["mean_tpot_ms"] == pytest.approx(1000 * sum(tpot) / len(tpot))
  assert "Successful requests:" in bench_serve.format_table(result)


def test_chunks_count_without_usage_and_goodput_slo(serve):
  server = serve(usage=False)
  requests = _smoke(4)
  result = bench_serve.run_benchmark(server.url, requests, model="m", endpoint="chat",
                                     slo_ttft_s=FIRST_DELAY_S / 2, slo_tpot_s=10.0)
  chunks = [min(r.sampling.max_new_tokens, MAX_CHUNKS) for r in requests]
  assert (result["completed"], result["failed"]) == (4, 0)
  assert result["output_lens"] == chunks and result["total_output_tokens"] == sum(chunks)
  assert result["request_goodput"] == 0.0   # every TTFT exceeds the server's first sleep
  for r, rid in zip(requests, result["request_ids"]):
    seen = server.records[rid]
    assert seen["path"] == "/v1/chat/completions" and seen["body"]["model"] == "m"
    assert seen["prompt"] == " ".join(map(str, r.prompt_ids))
  assert min(result["ttfts"]) >= FIRST_DELAY_S   # the role-only delta is not the first token


def test_chat_input_tokens_are_the_servers_usage_not_the_workload_ids(serve):
  server = serve()
  requests = _smoke(3)
  result = bench_serve.run_benchmark(server.url, requests, model="m", endpoint="chat")
  counted = [len(" ".join(map(str, r.prompt_ids))) + 100 for r in requests]   # the mock's usage
  assert result["input_lens"] == counted and result["total_input_tokens"] == sum(counted)


def test_429_requests_are_failed_with_their_message(serve):
  requests = _smoke()
  rejected = {0, 3, 4}
  server = serve(reject=[json.dumps(requests[i].prompt_ids) for i in rejected])
  result = bench_serve.run_benchmark(server.url, requests)
  assert (result["completed"], result["failed"]) == (3, 3)
  assert len(server.records) == 3
  for i, r in enumerate(requests):
    if i in rejected:
      assert result["errors"][i].startswith("HTTP 429: ")
      assert "too many requests" in result["errors"][i]
      assert result["request_ids"][i] is None and result["ttfts"][i] is None
    else:
      assert result["errors"][i] == "" and result["request_ids"][i] in server.records
  assert result["total_output_tokens"] == sum(
      r.sampling.max_new_tokens for i, r in enumerate(requests) if i not in rejected)
  assert result["total_input_tokens"] == sum(
      len(r.prompt_ids) for i, r in enumerate(requests) if i not in rejected)


def test_unreachable_server_is_a_failed_request():
  requests = _smoke(2)
  result = bench_serve.run_benchmark("http://127.0.0.1:9", requests, model="m")
  assert (result["completed"], result["failed"]) == (0, 2)
  assert all("ConnectError" in e for e in result["errors"])


def _cli(*args, timeout=120):
  return subprocess.run([sys.executable, "-m", "pdjax.bench_serve", *args],
                        capture_output=True, text=True, timeout=timeout)


def test_cli_writes_the_result(serve, tmp_path):
  server = serve()
  out = tmp_path / "result.json"
  proc = _cli(f"--base_url={server.url}", "--config=configs/default.py:smoke",
              "--config.workload.num_requests=4", f"--output={out}")
  assert proc.returncode == 0, proc.stderr
  assert "Serving Benchmark Result" in proc.stdout and proc.stderr == ""
  result = json.loads(out.read_text())
  requests = _smoke(4)
  assert (result["completed"], result["failed"], result["model_id"]) == (4, 0, "fake-model")
  assert result["input_lens"] == [len(r.prompt_ids) for r in requests]
  assert result["total_output_tokens"] == sum(r.sampling.max_new_tokens for r in requests)
  assert sorted(result["request_ids"]) == sorted(server.records)


@pytest.mark.parametrize("args,message", [
    (["--config.workload.bogus=1"], "config error: no key workload.bogus"),
    (["--config.workload.rate=-1"],
     "config error: workload.rate=-1.0 must be >= 0.0001 requests per second (arrivals "
     "further apart lose the clock's precision: at 1e-300 every duration rounded away)"),
    (["--config.model.preset=nope"],
     f"config error: model.preset='nope' is not one of {sorted(PRESETS)}"),
    (["--config=/nonexistent/cfg.py"], None),
])
def test_bad_config_flag_is_one_line(args, message):
  proc = _cli("--base_url=http://127.0.0.1:9", *args)
  if message is None:   # the library's wording of a missing file; one line naming it
    assert proc.stderr.startswith("config error: ") and "/nonexistent/cfg.py" in proc.stderr
    message = proc.stderr.strip()
  assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (2, message, "")


def test_bad_endpoint_flag_is_one_line():
  proc = _cli("--endpoint=grpc")
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
  assert proc.stderr.startswith("config error: flag --endpoint=grpc")


def test_no_jax_import():
  code = ("import sys, pdjax.bench_serve as b; from pdjax import config as c; "
          "b.load_requests(c.load_config_module('configs/default.py').get_config('smoke')); "
          "assert not [m for m in sys.modules if m == 'jax' or m.startswith('jax.')]")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("limit", [0, 2])
def test_max_concurrency_caps_the_requests_in_flight(serve, limit):
  """Six requests due at once: all six in flight without a limit, never more than two with
  --max_concurrency=2 (a closed loop), and every one completed either way."""
  server = serve()
  requests = _smoke()
  for r in requests:
    r.arrival_s = 0.0
  result = bench_serve.run_benchmark(server.url, requests, max_concurrency=limit)
  assert (result["completed"], result["failed"]) == (6, 0)
  assert server.max_inflight == (limit or 6)
  assert result["max_concurrency"] == (limit or None)
