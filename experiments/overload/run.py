"""Overload: arrivals at 1x-10x the sustainable rate, with and without admission control
(issue 7), on the simulator.

  python experiments/overload/run.py [--out=experiments/overload/run]

Llama-3-8B shapes on the h100 roofline preset, bf16: 2 prefill + 2 decode instances of TP1
(4 colocated for the colocated and chunked rows), the `mixed` workload, SLO TTFT 0.5 s /
TPOT 50 ms. 400 req/s is sustainable for every mode (100% attainment); each multiplier serves
3,000 requests at k x 400 req/s. Writes OUT/results.md: attainment over all requests and over
admitted ones, the share rejected (with the top reason), the longest queue and the largest
KV-pool share any instance reached, and goodput.
"""

import argparse
import json
import os
import subprocess
import sys

SUSTAINABLE = 400.0
MULTIPLIERS = (1, 2, 4, 10)
BASE = ["--config=configs/default.py", "--config.backend=sim", "--config.progress=False",
        "--config.model.preset=llama3_8b", "--config.model.dtype=bfloat16",
        "--config.sim.hardware=h100", "--config.kv.pages_per_instance=2048",
        "--config.cluster.prefill.tp=1", "--config.cluster.decode.tp=1",
        "--config.cluster.colocated.instances=4", "--config.cluster.colocated.tp=1",
        "--config.workload.num_requests=3000", "--config.slo.ttft_s=0.5",
        "--config.slo.tpot_s=0.05", "--config.mode=compare", "--config.workload.preset=mixed",
        "--config.scheduler.decode_buckets=(8,16,32,64,128)"]
ADMISSION = {
    "none": ["--config.scheduler.admission=none"],
    "queue_bound 16": ["--config.scheduler.admission=queue_bound",
                       "--config.scheduler.max_queue=16"],
    "predicted_slo": ["--config.scheduler.admission=predicted_slo"],
    "predicted_slo 0.8": ["--config.scheduler.admission=predicted_slo",
                          "--config.scheduler.admission_headroom=0.8"],
}


def row(folder: str) -> dict:
  with open(os.path.join(folder, "summary.json")) as f:
    s = json.load(f)
  roles = s["tiers"]["roles"]
  reasons = s.get("rejects_by_reason") or {}
  return {"all": s["slo_attainment"], "admitted": s["slo_attainment_admitted"],
          "rejected": s["requests"]["rejected"] / s["requests"]["total"],
          "reason": next(iter(reasons), "-"),
          "queue_max": max(r["queued"]["max"] or 0 for r in roles.values()),
          "kv_max": max(r["kv_used_frac_max"] or 0 for r in roles.values()),
          "goodput": s["goodput_rps"], "ttft_p90": s["ttft_s"]["p90"]}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="experiments/overload/run")
  out = parser.parse_args().out
  lines = ["| admission | load | run | attainment (all) | attainment (admitted) | rejected | "
           "top reject reason | max queue | max KV used | TTFT p90 ms | goodput req/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, flags in ADMISSION.items():
    for k in MULTIPLIERS:
      folder = os.path.join(out, name.replace(" ", "_"), f"x{k}")
      cmd = [sys.executable, "-m", "pdjax.run", *BASE, *flags,
             f"--config.workload.rate={k * SUSTAINABLE}", f"--workdir={folder}"]
      print("+", " ".join(cmd), file=sys.stderr, flush=True)
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
      for run in ("colocated", "chunked", "disaggregated"):
        r = row(os.path.join(folder, run))
        ttft = "-" if r["ttft_p90"] is None else f"{1e3 * r['ttft_p90']:.0f}"
        lines.append(f"| {name} | {k}x | {run} | {100 * r['all']:.1f}% | "
                     f"{100 * r['admitted']:.1f}% | {100 * r['rejected']:.1f}% | {r['reason']} | "
                     f"{r['queue_max']} | {100 * r['kv_max']:.0f}% | {ttft} | "
                     f"{r['goodput']:.0f} |")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
