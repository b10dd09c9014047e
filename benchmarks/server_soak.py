"""A soak test of `pdjax.serve`: constant load for a stated number of requests (or seconds),
the server's resident memory and the latency percentiles window by window.

  python benchmarks/server_soak.py [--requests=6000] [--rate=15] [--window=500]
      [--config=configs/default.py:smoke] [--mode=disaggregated] [--out=DIR]
      [--shared_prefixes=K --prefix_len=P]   (prompts start with one of K fixed prefixes)
      [-- extra --config.* overrides for the server]

Starts `python -m pdjax.serve` on a free loopback port, then sends windows of `--window`
requests through pdjax.bench_serve's client (streamed completions, token-id prompts of
--prompt_len tokens, --max_tokens output tokens with ignore_eos, one request every 1/rate s,
the next window right after the last answer of the previous one). After each window it reads
the server's VmRSS (/proc/PID/status) and times one /metrics scrape. At the end it stops the
server (SIGINT: it drains and writes its run folder) and checks its summary: every request
finished, no KV page leaked. Writes soak.json and soak.png into --out and prints a markdown
table. Memory "flat" is judged after warm-up (the first window): growth from the end of
window 1 to the last, against the goal of 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

from pdjax.client import bench as bench_serve
from pdjax.metrics.run_info import describe_backend, describe_model
from pdjax.request import Request, SamplingParams


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _own_rss_mb(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"no VmRSS for process {pid}")


def rss_mb(pid: int) -> float:
  """The server's resident memory, MiB: the HTTP process and its children (the engine-core
  process the server spawns; before this counted them, the soak read the HTTP process alone,
  ~70 MiB, and missed the engine)."""
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    children = [int(c) for c in f.read().split()]
  return _own_rss_mb(pid) + sum(_own_rss_mb(c) for c in children)


def start_server(config: str, mode: str, workdir: str, log_path: str, extra: list[str]):
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  t0 = time.perf_counter()
  server = subprocess.Popen(
      [sys.executable, "-m", "pdjax.serve", f"--config={config}", f"--config.mode={mode}",
       f"--port={port}", f"--workdir={workdir}", *extra],
      stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))   # pylint: disable=consider-using-with
  while True:
    if server.poll() is not None:
      raise SystemExit(f"the server exited (see {log_path})")
    try:
      with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
        if r.status == 200:
          return server, url, time.perf_counter() - t0
    except OSError:
      time.sleep(0.5)


def window_requests(n: int, rate: float, prompt_len: int, max_tokens: int, first: int,
                    rng: random.Random, vocab: int, prefixes: list | None = None) -> list[Request]:
  """prefixes: each prompt starts with one of them (drawn at random), a random tail after it
  (the prefix cache and host tier see hits, evictions and offloads)."""
  out = []
  for i in range(n):
    head = list(rng.choice(prefixes)) if prefixes else []
    tail = [rng.randrange(1, vocab) for _ in range(max(prompt_len - len(head), 1))]
    out.append(Request(id=f"soak-{first + i}", arrival_s=i / rate, prompt_ids=head + tail,
                       sampling=SamplingParams(max_new_tokens=max_tokens, ignore_eos=True)))
  return out


def scrape_ms(url: str) -> float:
  t0 = time.perf_counter()
  with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
    r.read()
  return (time.perf_counter() - t0) * 1000


def percentile_ms(values: list, p: float) -> float:
  values = [v for v in values if v is not None]
  return float(np.percentile(values, p) * 1000) if values else float("nan")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/default.py:smoke")
  parser.add_argument("--mode", default="disaggregated")
  parser.add_argument("--requests", type=int, default=6000)
  parser.add_argument("--seconds", type=float, default=0.0,
                      help="run this long instead (whole windows; --requests is then ignored)")
  parser.add_argument("--rate", type=float, default=15.0, help="requests per second")
  parser.add_argument("--window", type=int, default=500)
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--max_tokens", type=int, default=16)
  parser.add_argument("--vocab", type=int, default=256, help="prompt ids drawn from [1, vocab)")
  parser.add_argument("--shared_prefixes", type=int, default=0,
                      help="prompts start with one of this many fixed prefixes (0: none)")
  parser.add_argument("--prefix_len", type=int, default=16, help="tokens of each prefix")
  parser.add_argument("--out", default="")
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != "--"]
  out = args.out or tempfile.mkdtemp(prefix="pdjax-soak-")
  os.makedirs(out, exist_ok=True)
  t_start = time.perf_counter()
  server, url, startup_s = start_server(args.config, args.mode, os.path.join(out, "run"),
                                        os.path.join(out, "serve.log"), extra)
  rng, rows, sent = random.Random(0), [], 0
  prefixes = [[rng.randrange(1, args.vocab) for _ in range(args.prefix_len)]
              for _ in range(args.shared_prefixes)]
  try:
    model = bench_serve.default_model(url)
    while (time.perf_counter() - t_start < args.seconds) if args.seconds else \
        sent < args.requests:
      n = args.window if args.seconds else min(args.window, args.requests - sent)
      reqs = window_requests(n, args.rate, args.prompt_len, args.max_tokens, sent, rng,
                             args.vocab, prefixes)
      result = bench_serve.run_benchmark(url, reqs, model=model)
      sent += n
      itl = [g for gaps in result["itls"] if gaps for g in gaps]
      tpots = [(e - t) / (k - 1) for t, e, k in
               zip(result["ttfts"], result["e2els"], result["output_lens"])
               if t is not None and e is not None and k > 1]
      rows.append({"requests": sent, "elapsed_s": time.perf_counter() - t_start,
                   "rss_mb": rss_mb(server.pid), "failed": result["failed"],
                   "throughput": result["request_throughput"],
                   "p50_ttft_ms": percentile_ms(result["ttfts"], 50),
                   "p99_ttft_ms": percentile_ms(result["ttfts"], 99),
                   "p50_tpot_ms": percentile_ms(tpots, 50), "p99_tpot_ms": percentile_ms(tpots, 99),
                   "p99_itl_ms": percentile_ms(itl, 99), "scrape_ms": scrape_ms(url)})
      print(json.dumps(rows[-1]), flush=True)
  finally:
    server.send_signal(signal.SIGINT)
    code = server.wait(timeout=600)
  with open(os.path.join(out, "run", "summary.json")) as f:
    summary = json.load(f)
  total_s = time.perf_counter() - t_start
  report(args, rows, summary, code, startup_s, total_s, out)


def report(args, rows, summary, code, startup_s, total_s, out) -> None:
  info = summary["run_info"]
  reqs = summary["requests"]
  base = rows[0]["rss_mb"]
  growth = (rows[-1]["rss_mb"] - base) / base * 100
  head = (f"pdjax.serve soak: {describe_model(info['model'])}, {describe_backend(info['backend'])}, "
          f"{info['placement']['describe']} ({args.mode}); "
          f"{rows[-1]['requests']} requests at {args.rate:g} req/s, "
          f"prompt {args.prompt_len} / output {args.max_tokens} tokens; server start "
          f"{startup_s:.1f} s, whole command {total_s:.0f} s; exit code {code}")
  lines = [head, "",
           "| requests | elapsed s | server RSS MiB | failed | p50 / p99 TTFT ms | "
           "p50 / p99 TPOT ms | p99 ITL ms | /metrics scrape ms |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['requests']} | {r['elapsed_s']:.0f} | {r['rss_mb']:.1f} | {r['failed']} "
                 f"| {r['p50_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f} | {r['p50_tpot_ms']:.2f} / "
                 f"{r['p99_tpot_ms']:.2f} | {r['p99_itl_ms']:.2f} | {r['scrape_ms']:.1f} |")
  verdict = "flat" if abs(growth) <= 5 else "NOT flat"
  lines += ["", f"memory after warm-up (end of window 1 -> last): {base:.1f} -> "
            f"{rows[-1]['rss_mb']:.1f} MiB, {growth:+.1f}% ({verdict} against the 5% goal); "
            f"server summary: {reqs['finished']} finished of {reqs['total']}, "
            f"{summary['kv_pages_leaked']} KV pages leaked"]
  print("\n".join(lines))
  with open(os.path.join(out, "soak.json"), "w") as f:
    json.dump({"args": vars(args), "rows": rows, "startup_s": startup_s, "total_s": total_s,
               "exit_code": code, "server_requests": reqs, "run_info": info}, f, indent=2)
  plot(rows, head, os.path.join(out, "soak.png"))
  print(f"files: {out}")


def plot(rows, title: str, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  n = [r["requests"] for r in rows]
  fig, (mem, lat) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
  mem.plot(n, [r["rss_mb"] for r in rows], marker="o")
  mem.set_ylabel("server RSS (MiB)")
  mem.set_ylim(bottom=0)
  for key in ("p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms"):
    lat.plot(n, [r[key] for r in rows], marker=".", label=key)
  lat.set_ylabel("ms")
  lat.set_yscale("log")
  lat.set_xlabel("requests sent")
  lat.legend(fontsize=8)
  fig.suptitle(title, fontsize=8, wrap=True)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  main()
