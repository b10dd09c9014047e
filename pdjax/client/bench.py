"""A benchmark client for OpenAI-compatible servers (pdjax.serve or any other), measuring what
`vllm bench serve` measures: each request of a workload is sent streaming at its arrival time,
and TTFT, TPOT, ITL and E2E latency are taken from the client side; `aggregate` turns the
outputs into vllm's result keys, `format_table` into its text table. The command is
`pdjax.bench_serve`. Host logic only: no jax import."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time

import httpx
import numpy as np

from pdjax import config as config_lib
from pdjax.cli import first_and_last_line

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 95, 99)


@dataclasses.dataclass
class RequestOutput:
  """What the client measured for one request (times in seconds, perf_counter based)."""
  prompt_len: int                   # the workload's; usage.prompt_tokens once the server says
  success: bool = False
  request_id: str | None = None     # the server's "id" from its first chunk
  output_tokens: int = 0            # usage.completion_tokens, else the content chunks
  send_s: float = 0.0               # when the request was sent, from the benchmark's start
  ttft: float | None = None         # first content chunk - send
  itl: list[float] = dataclasses.field(default_factory=list)   # gaps between content chunks
  e2el: float | None = None         # last content chunk - send
  error: str = ""

  @property
  def tpot(self) -> float | None:
    """(e2el - ttft) / (output_tokens - 1); None for outputs of fewer than two tokens."""
    if not self.success or self.output_tokens < 2:
      return None
    return (self.e2el - self.ttft) / (self.output_tokens - 1)


def load_requests(cfg) -> tuple[list, list[str]]:
  """The config's workload as `pdjax.runner.execute.execute` loads it: (Requests, problem lines).
  Raises config_lib.ConfigError (bad model) or ValueError (bad workload)."""
  from pdjax.workload.loader import load_workload
  mcfg = config_lib.model_config(cfg)
  return load_workload(cfg.workload, seed=cfg.seed, vocab_size=mcfg.vocab_size,
                       eos_ids=mcfg.eos_token_ids, max_model_len=cfg.kv.max_model_len,
                       temperature=cfg.sampling.temperature)


def payload(request, *, endpoint: str, model: str, temperature: float) -> dict:
  """The JSON body of one streaming request: token-id prompt for completions; for chat, one
  user message holding the request's text prompt, or its ids joined by spaces."""
  body = {"model": model, "max_tokens": int(request.sampling.max_new_tokens),
          "temperature": float(temperature), "stream": True,
          "stream_options": {"include_usage": True}, "ignore_eos": True}
  if endpoint == "chat":
    text = getattr(request, "prompt_text", "") or " ".join(map(str, request.prompt_ids))
    body["messages"] = [{"role": "user", "content": text}]
  else:
    body["prompt"] = [int(t) for t in request.prompt_ids]
  return body


def _has_content(choice: dict) -> bool:
  """True when a streamed choice carries generated output (text, delta content or token ids);
  a chat role-only delta or an empty final chunk does not."""
  delta = choice.get("delta") or {}
  return bool(choice.get("text") or delta.get("content") or choice.get("token_ids")
              or delta.get("token_ids"))


async def send_one(client: httpx.AsyncClient, url: str, body: dict, prompt_len: int,
                   start: float) -> RequestOutput:
  """POSTs one streaming request and reads its SSE chunks until `data: [DONE]`. A status other
  than 200, an error object, an exception, no content or no [DONE] make it failed."""
  out = RequestOutput(prompt_len=prompt_len)
  sent = time.perf_counter()
  out.send_s = sent - start
  times, chunks, usage_tokens, done = [], 0, None, False
  try:
    async with client.stream("POST", url, json=body) as response:
      if response.status_code != 200:
        text = (await response.aread()).decode(errors="replace")
        out.error = " ".join(f"HTTP {response.status_code}: {text}".split())[:500]
        return out
      async for line in response.aiter_lines():
        now = time.perf_counter()
        line = line.strip()
        if not line.startswith("data:"):
          continue   # blank separators, ": keep-alive" comments, event: lines
        data = line[len("data:"):].strip()
        if data == "[DONE]":
          done = True
          break
        chunk = json.loads(data)
        if chunk.get("error"):
          error = chunk["error"]
          out.error = str(error.get("message", error) if isinstance(error, dict) else error)
          return out
        if out.request_id is None and chunk.get("id"):
          out.request_id = str(chunk["id"])
        if (chunk.get("usage") or {}).get("completion_tokens") is not None:
          usage_tokens = int(chunk["usage"]["completion_tokens"])
        if (chunk.get("usage") or {}).get("prompt_tokens") is not None:
          out.prompt_len = int(chunk["usage"]["prompt_tokens"])   # what the server counted
          # (a chat's template adds tokens the workload's ids do not hold)
        if any(_has_content(c) for c in chunk.get("choices") or ()):
          times.append(now)
          chunks += 1
  except Exception as e:  # pylint: disable=broad-except
    out.error = first_and_last_line(f"{type(e).__name__}: {e}") or type(e).__name__
    return out
  if times:
    out.ttft, out.e2el = times[0] - sent, times[-1] - sent
    out.itl = [b - a for a, b in zip(times, times[1:])]
  out.output_tokens = usage_tokens if usage_tokens is not None else chunks
  if not done:
    out.error = "the stream ended before data: [DONE]"
  elif not times:
    out.error = "no content chunk in the stream"
  else:
    out.success = True
  return out


async def benchmark(base_url: str, requests, *, model: str, endpoint: str = "completions",
                    temperature: float = 0.0,
                    max_concurrency: int = 0) -> tuple[list[RequestOutput], float]:
  """Sends every request at its arrival_s after the start (one task each); returns the
  outputs in workload order and the duration (start to the last response) in seconds.
  max_concurrency > 0: at most that many requests in flight (as `vllm bench serve
  --max-concurrency`): a request due while all are busy is sent when one ends, and its
  latencies start when it is sent; with every arrival at 0 this is a closed loop."""
  url = base_url.rstrip("/") + ENDPOINTS[endpoint]
  # No proxies from the environment (the server is measured directly); no pool limit (a
  # request waiting for a free connection would count the wait as server latency).
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  timeout = httpx.Timeout(None, connect=60.0)
  async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
    start = time.perf_counter()
    slots = (asyncio.Semaphore(max_concurrency) if max_concurrency > 0
             else contextlib.nullcontext())

    async def send(body, prompt_len):
      async with slots:
        return await send_one(client, url, body, prompt_len, start)
    tasks = []
    for request in requests:
      delay = start + request.arrival_s - time.perf_counter()
      if delay > 0:
        await asyncio.sleep(delay)
      body = payload(request, endpoint=endpoint, model=model, temperature=temperature)
      tasks.append(asyncio.create_task(send(body, len(request.prompt_ids))))
    outputs = await asyncio.gather(*tasks)
    return list(outputs), time.perf_counter() - start


def default_model(base_url: str) -> str:
  """The first model id that GET {base_url}/v1/models lists."""
  response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30.0, trust_env=False)
  response.raise_for_status()
  return str(response.json()["data"][0]["id"])


def _stats(prefix: str, values: list[float]) -> dict:
  """mean/median/std/p90/p95/p99 of values (seconds) in milliseconds, 0 when empty."""
  ms = np.asarray(values, dtype=float) * 1000.0
  if not len(ms):
    ms = np.zeros(1)
  out = {f"mean_{prefix}_ms": float(ms.mean()), f"median_{prefix}_ms": float(np.median(ms)),
         f"std_{prefix}_ms": float(ms.std())}
  out.update({f"p{p}_{prefix}_ms": float(np.percentile(ms, p)) for p in PERCENTILES})
  return out


def aggregate(outputs: list[RequestOutput], duration_s: float, *, slo_ttft_s: float,
              slo_tpot_s: float) -> dict:
  """The result dict (vllm bench serve's keys). Totals and latency statistics count the
  successful requests; goodput counts those with ttft <= slo_ttft_s and tpot <= slo_tpot_s
  (an output of one token meets the TPOT SLO). Per-request lists are in workload order."""
  ok = [o for o in outputs if o.success]
  duration = max(duration_s, 1e-9)
  good = sum(o.ttft <= slo_ttft_s and (o.tpot is None or o.tpot <= slo_tpot_s) for o in ok)
  total_in = sum(o.prompt_len for o in ok)
  total_out = sum(o.output_tokens for o in ok)
  result = {
      "duration": duration_s, "completed": len(ok), "failed": len(outputs) - len(ok),
      "total_input_tokens": total_in, "total_output_tokens": total_out,
      "request_throughput": len(ok) / duration, "request_goodput": good / duration,
      "output_throughput": total_out / duration,
      "total_token_throughput": (total_in + total_out) / duration,
  }
  values = {"ttft": [o.ttft for o in ok], "tpot": [o.tpot for o in ok if o.tpot is not None],
            "itl": [g for o in ok for g in o.itl], "e2el": [o.e2el for o in ok]}
  for m in METRICS:
    result.update(_stats(m, values[m]))
  result.update({
      "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
      "e2els": [o.e2el for o in outputs], "input_lens": [o.prompt_len for o in outputs],
      "output_lens": [o.output_tokens for o in outputs], "errors": [o.error for o in outputs],
      "request_ids": [o.request_id for o in outputs],
      "send_times": [o.send_s for o in outputs]})
  return result


def run_benchmark(base_url: str, requests, *, model: str | None = None,
                  endpoint: str = "completions", temperature: float = 0.0,
                  slo_ttft_s: float = float("inf"), slo_tpot_s: float = float("inf"),
                  max_concurrency: int = 0) -> dict:
  """The core: benchmarks `requests` against the server and returns the result dict (with
  model_id, endpoint, base_url, num_prompts and max_concurrency (None: unlimited) added).
  model None: the server's first."""
  model = model or default_model(base_url)
  outputs, duration = asyncio.run(benchmark(base_url, requests, model=model,
                                            endpoint=endpoint, temperature=temperature,
                                            max_concurrency=max_concurrency))
  result = {"date": time.strftime("%Y%m%d-%H%M%S"), "base_url": base_url, "endpoint": endpoint,
            "model_id": model, "num_prompts": len(requests),
            "max_concurrency": max_concurrency or None}
  result.update(aggregate(outputs, duration, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s))
  return result


def format_table(result: dict) -> str:
  """The result as vllm's text table."""
  rows = [("Successful requests:", result["completed"]), ("Failed requests:", result["failed"]),
          ("Benchmark duration (s):", result["duration"]),
          ("Total input tokens:", result["total_input_tokens"]),
          ("Total generated tokens:", result["total_output_tokens"]),
          ("Request throughput (req/s):", result["request_throughput"]),
          ("Request goodput (req/s):", result["request_goodput"]),
          ("Output token throughput (tok/s):", result["output_throughput"]),
          ("Total token throughput (tok/s):", result["total_token_throughput"])]
  for m, name in zip(METRICS, ("Time to First Token", "Time per Output Token (excl. 1st "
                               "token)", "Inter-token Latency", "End-to-end Latency")):
    rows.append((f"---{name}---", None))
    rows += [(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} {m.upper()} (ms):",
              result[f"{stat}_{m}_ms"]) for stat in ("mean", "median", "std", "p99")]
  lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]
  for label, value in rows:
    if value is None:
      lines.append("{s:{c}^50}".format(s=label[3:-3], c="-"))
    else:
      lines.append(f"{label:<40}{value:<10.2f}" if isinstance(value, float)
                   else f"{label:<40}{value:<10}")
  return "\n".join(lines + ["=" * 50])
