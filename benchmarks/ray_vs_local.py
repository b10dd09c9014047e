"""The default workload, disaggregated, with every instance in one process (cluster.launcher=
local) and with one Ray actor process per instance (ray), in one run of this script.

  python benchmarks/ray_vs_local.py [--out=F.json] [-- extra --config.* overrides]

Runs `python -m pdjax.run --config.mode=disaggregated --config.cluster.launcher=<each>` (the
embedded default config: 2 prefill x TP2 + 2 decode x TP2, 64 requests at 8 req/s) and
reports what a user waits for (the whole command: Ray start, actor start-up, compiles, output
writing) beside the run's own figures: TTFT and TPOT p50/p99, KV transfer mean, and the
transfer share of the wait for decoding: per request, transfer seconds / (decode start -
arrival), median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(launcher: str, workdir: str, extra: list[str]) -> dict:
  cmd = [sys.executable, "-m", "pdjax.run", "--config.mode=disaggregated",
         f"--config.cluster.launcher={launcher}", "--config.progress=False",
         f"--workdir={workdir}", *extra]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f"{launcher}: exit {proc.returncode}: {proc.stderr[-2000:]}")
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  reqs = [json.loads(line) for line in open(os.path.join(workdir, "requests.jsonl"))]
  shares = [r["transfer_s"] / (r["decode_start_s"] - r["arrival_s"]) for r in reqs
            if r.get("transfer_s") and r.get("decode_start_s")]
  return {"launcher": launcher, "command_s": wall,
          "finished": sum(r["status"] == "finished" for r in reqs), "total": len(reqs),
          "ttft_p50_ms": 1e3 * summary["ttft_s"]["p50"], "ttft_p99_ms": 1e3 * summary["ttft_s"]["p99"],
          "tpot_p50_ms": 1e3 * summary["tpot_s"]["p50"], "tpot_p99_ms": 1e3 * summary["tpot_s"]["p99"],
          "transfer_mean_ms": 1e3 * summary["kv_transfer"]["mean_s"],
          "transfer_share_p50": statistics.median(shares) if shares else 0.0,
          "leaked": summary["kv_pages_leaked"]}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="")
  args, extra = ap.parse_known_args()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for launcher in ("local", "ray"):
      rows.append(run(launcher, os.path.join(tmp, launcher), extra))
  keys = list(rows[0])[1:]
  print("| " + " | ".join(["launcher"] + keys) + " |")
  print("|" + "---|" * (len(keys) + 1))
  for r in rows:
    print("| " + " | ".join([r["launcher"]] + [f"{r[k]:.3f}" if isinstance(r[k], float)
                                                  else str(r[k]) for k in keys]) + " |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
