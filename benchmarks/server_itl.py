"""Inter-token latency through `pdjax.serve` at concurrency 4, beside the engine's own step.

  python benchmarks/server_itl.py [--layout=auto|stacked|unrolled|none] [--requests=16]

Starts `python -m pdjax.serve --config=pdjax/configs/smollm2.py --config.mode=disaggregated`
(SmolLM2-135M, 1 prefill + 1 decode TP1 instance, prefill buckets (128, 512), decode buckets
(4, 8)) and sends it --requests streaming /v1/completions requests through `pdjax.bench_serve`'s
client with --max_concurrency=4 (all due at once: a closed loop of 4; 64 random token ids each,
64 tokens, greedy, ignore_eos). Prints
the server's start-up seconds, mean and median ITL (gaps between streamed chunks) and mean
TTFT as the client sees them; where the time goes inside the server (its trace.json: decode
steps alone and beside a prefill, the interval between decode steps, the host's phases; ITL
over that interval is what the HTTP path adds to the engine's own token interval); and
then, in the same sitting, the engine's step alone (`benchmarks/decode_profile.py --batches=4`
with the server's pool and block-table sizes) and ITL over it. --layout=none passes no
model.param_layout (a tree from before the key existed, through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))


def step_breakdown(trace_path: str) -> tuple[float, str]:
  """Where a token's time goes inside the server, from its trace.json (engine step spans):
  decode steps' mean length (all, and those that overlapped a prefill step on the other
  instance), the mean interval between decode steps' ends (the engine's token interval) and
  the host's phases (plan, dispatch, readback) per decode step: (that mean interval in ms,
  the text)."""
  import json
  with open(trace_path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
  steps = [e for e in events if e["cat"] == "step"]
  decode = sorted((e for e in steps if e["name"] == "decode"), key=lambda e: e["ts"])
  prefill = [(e["ts"], e["ts"] + e["dur"]) for e in steps if e["name"] != "decode"]

  def overlaps(e):
    return any(s < e["ts"] + e["dur"] and e["ts"] < t for s, t in prefill)
  mixed = [e["dur"] for e in decode if overlaps(e)]
  alone = [e["dur"] for e in decode if not overlaps(e)]
  ends = [e["ts"] + e["dur"] for e in decode]
  gaps = [b - a for a, b in zip(ends, ends[1:])]
  host = {}
  for e in events:
    if e["cat"] == "host":
      host.setdefault(e["name"], []).append(e["dur"])
  mean = lambda xs: statistics.mean(xs) / 1e3 if xs else float("nan")
  everything = mean([e["dur"] for e in decode])
  return mean(gaps), (
      f"server trace: {len(decode)} decode steps, mean {everything:.1f} "
      f"ms ({len(alone)} alone {mean(alone):.1f} ms, {len(mixed)} beside a prefill "
      f"{mean(mixed):.1f} ms); decode step ends every {mean(gaps):.1f} ms (median "
      f"{statistics.median(gaps) / 1e3:.1f}); {len(prefill)} prefill steps, "
      f"{sum(t - s for s, t in prefill) / 1e6:.2f} s; host per step (ms): "
      + ", ".join(f"{k} {mean(v):.2f}" for k, v in sorted(host.items())))


def ttft_breakdown(requests_path: str) -> str:
  """A request's TTFT inside the server, from its requests.jsonl: waiting for the prefill
  instance (arrival -> prefill start) and the prefill step (start -> end), means."""
  import json
  with open(requests_path) as f:
    rows = [json.loads(line) for line in f]
  queue = [r["prefill_start_s"] - r["arrival_s"] for r in rows]
  prefill = [r["prefill_end_s"] - r["prefill_start_s"] for r in rows]
  return (f"server requests: TTFT mean {statistics.mean(r['ttft_s'] for r in rows) * 1e3:.0f} ms"
          f" = waiting for the prefill instance {statistics.mean(queue) * 1e3:.0f} ms + its "
          f"prefill step {statistics.mean(prefill) * 1e3:.0f} ms (+ the rest)")


def step_alone(layout: str) -> tuple[float, float]:
  """The engine's batch-4 decode step and its prefill of one 64-token prompt (bucket 128)
  alone, in ms (benchmarks/decode_profile.py in a subprocess, with the server's pool and
  block-table sizes)."""
  import re
  import subprocess
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "decode_profile.py"),
                        "--batches=4", "--context=96", "--num_pages=512",
                        "--max_model_len=1024", f"--layout={layout}", "--reps=15",
                        "--prefill_len=64", "--prefill_bucket=128"],
                       capture_output=True, text=True, check=True).stdout
  return (float(re.search(r"batch 4: step ([0-9.]+) ms", out).group(1)),
          float(re.search(r"prefill 1 x 64 tokens \(bucket 128\): ([0-9.]+) ms", out).group(1)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layout", default="auto")
  parser.add_argument("--requests", type=int, default=16)
  parser.add_argument("--server_flags", default="", help="more pdjax.serve flags, "
                      "space-separated (e.g. --config.scheduler.overlap=true)")
  args = parser.parse_args()
  from helpers.server_process import start_server
  from pdjax.client.bench import run_benchmark
  from pdjax.request import Request, SamplingParams
  work = tempfile.mkdtemp(prefix="pdjax_itl_")
  layout = [] if args.layout == "none" else [f"--config.model.param_layout={args.layout}"]
  log = open(os.path.join(work, "serve.log"), "w")
  t0 = time.perf_counter()
  proc, url = start_server(["--config=pdjax/configs/smollm2.py", "--config.mode=disaggregated",
                            *layout, "--config.scheduler.prefill_buckets=(128,512)",
                            "--config.scheduler.decode_buckets=(4,8)",
                            *args.server_flags.split()],
                           os.path.join(work, "run"), log, timeout_s=900)
  startup = time.perf_counter() - t0
  rng = random.Random(0)
  prompts = [[rng.randrange(3, 49000) for _ in range(64)] for _ in range(args.requests)]
  requests = [Request(id=f"itl-{i}", arrival_s=0.0, prompt_ids=p,
                      sampling=SamplingParams(max_new_tokens=64, ignore_eos=True))
              for i, p in enumerate(prompts)]
  t1 = time.perf_counter()
  try:   # pdjax.bench_serve's client: every request due at once, at most 4 in flight
    result = run_benchmark(url, requests, max_concurrency=4)
  finally:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
  if result["failed"]:
    raise SystemExit(f"{result['failed']} requests failed: {result['errors']}")
  itls = [g for gaps in result["itls"] for g in gaps]
  ttfts = result["ttfts"]
  wall = time.perf_counter() - t1
  interval_ms, breakdown = step_breakdown(os.path.join(work, "run", "trace.json"))
  print(breakdown)
  print(ttft_breakdown(os.path.join(work, "run", "requests.jsonl")))
  print(f"pdjax.serve SmolLM2-135M float32 1P+1D TP1, layout {args.layout}, CPU "
        f"{os.cpu_count()} cores: start-up {startup:.1f} s; {args.requests} requests at "
        f"concurrency 4 in {wall:.1f} s; ITL mean {statistics.mean(itls) * 1e3:.1f} ms, "
        f"median {statistics.median(itls) * 1e3:.1f} ms; TTFT mean "
        f"{statistics.mean(ttfts) * 1e3:.0f} ms; ITL / the server's own decode step interval "
        f"{statistics.mean(itls) * 1e3 / interval_ms:.2f}x (the HTTP path's share; the rest "
        "is the steps themselves)")
  if args.layout != "none":
    step_ms, prefill_ms = step_alone(args.layout)
    print(f"the step alone (decode_profile, batch 4, context 96, the server's 512-page pool "
          f"and max_model_len 1024, same layout, run now): {step_ms:.1f} ms; ITL / step "
          f"{statistics.mean(itls) * 1e3 / step_ms:.2f}x (mean), "
          f"{statistics.median(itls) * 1e3 / step_ms:.2f}x (median)")
    print(f"the prefill alone (one 64-token prompt, bucket 128, same tool): {prefill_ms:.1f} "
          f"ms; server TTFT / prefill alone {statistics.mean(ttfts) * 1e3 / prefill_ms:.2f}x")


if __name__ == "__main__":
  main()
