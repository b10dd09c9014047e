"""`pdjax.bench_serve` against `pdjax.serve`, colocated vs disaggregated, one run of this script.

  python benchmarks/serve_modes.py [--config=configs/smollm2.py] [--modes=colocated,disaggregated]
      [--out=F.json] [-- extra --config.* overrides for both the server and the client]

For each mode: starts `python -m pdjax.serve --config=CONFIG --config.mode=MODE` on a free
loopback port, waits for /health (the start-up seconds are reported), runs `python -m
pdjax.bench_serve --base_url=... --config=CONFIG` (the config's workload, streamed, token-id
prompts, ignore_eos), stops the server (SIGINT: it drains and writes its run folder) and reads
the server's summary.json beside the client's JSON. Prints one table, vllm bench serve's keys
(client side) plus the server's own TTFT/TPOT p50.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

KEYS = ["completed", "failed", "duration", "request_throughput", "request_goodput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def one_mode(config: str, mode: str, tmp: str, extra: list[str]) -> dict:
  port, workdir = free_port(), os.path.join(tmp, mode)
  url = f"http://127.0.0.1:{port}"
  t0 = time.perf_counter()
  server = subprocess.Popen(
      [sys.executable, "-m", "pdjax.serve", f"--config={config}", f"--config.mode={mode}",
       f"--port={port}", f"--workdir={workdir}", *extra],
      stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"{mode}.log"), "w"))
  while True:
    if server.poll() is not None:
      raise SystemExit(f"{mode}: the server exited ({os.path.join(tmp, mode + '.log')})")
    try:
      with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
        if r.status == 200:
          break
    except OSError:
      time.sleep(1)
  startup_s = time.perf_counter() - t0
  out = os.path.join(tmp, f"{mode}-bench.json")
  subprocess.run([sys.executable, "-m", "pdjax.bench_serve", f"--base_url={url}",
                  f"--config={config}", f"--output={out}", *extra], check=True,
                 stdout=subprocess.DEVNULL)
  server.send_signal(signal.SIGINT)
  server.wait(timeout=600)
  bench = json.load(open(out))
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  row = {"mode": mode, "server_startup_s": startup_s, **{k: bench[k] for k in KEYS}}
  row["server_ttft_p50_ms"] = 1e3 * summary["ttft_s"]["p50"]
  row["server_tpot_p50_ms"] = 1e3 * summary["tpot_s"]["p50"]
  row["kv_pages_leaked"] = summary["kv_pages_leaked"]
  return row


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="configs/smollm2.py")
  ap.add_argument("--modes", default="colocated,disaggregated")
  ap.add_argument("--out", default="")
  args, extra = ap.parse_known_args()
  with tempfile.TemporaryDirectory() as tmp:
    rows = [one_mode(args.config, m, tmp, extra) for m in args.modes.split(",")]
  keys = list(rows[0])
  print("| " + " | ".join(keys) + " |")
  print("|" + "---|" * len(keys))
  for r in rows:
    print("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k])
                             for k in keys) + " |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
