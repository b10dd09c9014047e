"""Inter-token latency through `pdjax.serve` at concurrency 4, beside the engine's own step.

  python benchmarks/server_itl.py [--layout=auto|stacked|unrolled|none] [--requests=16]

Starts `python -m pdjax.serve --config=pdjax/configs/smollm2.py --config.mode=disaggregated`
(SmolLM2-135M, 1 prefill + 1 decode TP1 instance, prefill buckets (128, 512), decode buckets
(4, 8)) and keeps 4 streaming /v1/completions requests in flight (a closed loop of 4 clients:
64 random token ids each, 64 tokens, greedy, ignore_eos) until --requests are served. Prints
the server's start-up seconds, mean and median ITL (gaps between streamed chunks) and mean
TTFT as the client sees them. Compare the ITL with `python benchmarks/decode_profile.py
--batches=4` (the step alone) run in the same sitting. --layout=none passes no
model.param_layout (a tree from before the key existed, through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layout", default="auto")
  parser.add_argument("--requests", type=int, default=16)
  args = parser.parse_args()
  import httpx
  from helpers.server_process import start_server
  work = tempfile.mkdtemp(prefix="pdjax_itl_")
  layout = [] if args.layout == "none" else [f"--config.model.param_layout={args.layout}"]
  log = open(os.path.join(work, "serve.log"), "w")
  t0 = time.perf_counter()
  proc, url = start_server(["--config=pdjax/configs/smollm2.py", "--config.mode=disaggregated",
                            *layout, "--config.scheduler.prefill_buckets=(128,512)",
                            "--config.scheduler.decode_buckets=(4,8)"],
                           os.path.join(work, "run"), log, timeout_s=900)
  startup = time.perf_counter() - t0
  rng = random.Random(0)
  prompts = [[rng.randrange(3, 49000) for _ in range(64)] for _ in range(args.requests)]
  itls, ttfts = [], []

  async def one(client, model, prompt):
    body = {"model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0.0,
            "stream": True, "ignore_eos": True}
    start = time.perf_counter()
    last = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
      async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
          continue
        now = time.perf_counter()
        if last is None:
          ttfts.append(now - start)
        else:
          itls.append(now - last)
        last = now

  async def run():
    async with httpx.AsyncClient(timeout=900) as client:
      model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
      queue = list(prompts)

      async def worker():
        while queue:
          await one(client, model, queue.pop())
      await asyncio.gather(*[worker() for _ in range(4)])

  t1 = time.perf_counter()
  try:
    asyncio.run(run())
  finally:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
  wall = time.perf_counter() - t1
  print(f"pdjax.serve SmolLM2-135M float32 1P+1D TP1, layout {args.layout}, CPU "
        f"{os.cpu_count()} cores: start-up {startup:.1f} s; {args.requests} requests at "
        f"concurrency 4 in {wall:.1f} s; ITL mean {statistics.mean(itls) * 1e3:.1f} ms, "
        f"median {statistics.median(itls) * 1e3:.1f} ms; TTFT mean "
        f"{statistics.mean(ttfts) * 1e3:.0f} ms")


if __name__ == "__main__":
  main()
