"""Prefix cache on vs off, and prefix-aware vs load-only routing, on the simulator (issue 6).

  python experiments/prefix_cache/run.py [--out=experiments/prefix_cache/run]
      [--scenario=decode_bound|prefill_bound]

Llama-3-8B shapes on the h100 roofline preset, 4 prefill + 4 decode instances of TP1 (and 8
colocated for the colocated rows), Poisson arrivals. Workloads: agent_multiturn (sessions whose
turns repeat the previous turn's prompt) and rag (a shared system prefix and repeated passages).
Writes OUT/results.md: TTFT, the prefill tier's busy share, prompt tokens actually prefilled,
hit rates, and KV bytes moved.

Scenario prefill_bound: 1 prefill + 7 decode instances (8 colocated) at 140 req/s, where the
lone prefill instance runs at 95% busy without the cache.
"""

import argparse
import json
import os
import subprocess
import sys

BASE = ["--config=configs/default.py", "--config.backend=sim", "--config.progress=False",
        "--config.model.preset=llama3_8b", "--config.model.dtype=bfloat16",
        "--config.sim.hardware=h100", "--config.kv.pages_per_instance=4096",
        "--config.cluster.prefill.instances=4", "--config.cluster.prefill.tp=1",
        "--config.cluster.decode.instances=4", "--config.cluster.decode.tp=1",
        "--config.cluster.colocated.instances=8", "--config.cluster.colocated.tp=1",
        "--config.workload.num_requests=2000", "--config.slo.ttft_s=0.2",
        "--config.slo.tpot_s=0.05", "--config.mode=compare"]
WORKLOADS = {"agent_multiturn": ["--config.workload.preset=agent_multiturn",
                                 "--config.workload.rate=60"],
             "rag": ["--config.workload.preset=rag", "--config.workload.rate=60"]}
SETTINGS = {
    "cache off, least_loaded": ["--config.kv.prefix_cache=False"],
    "cache on, least_loaded": ["--config.kv.prefix_cache=True"],
    "cache on, kv_aware_prefix": ["--config.kv.prefix_cache=True",
                                  "--config.scheduler.prefill_router=kv_aware_prefix",
                                  "--config.scheduler.decode_router=session_sticky"],
}


SCENARIOS = {
    "decode_bound": [],
    "prefill_bound": ["--config.cluster.prefill.instances=1",
                      "--config.cluster.decode.instances=7", "--config.workload.rate=140"],
}


def row(folder: str, run: str) -> dict:
  with open(os.path.join(folder, run, "summary.json")) as f:
    s = json.load(f)
  with open(os.path.join(folder, run, "requests.jsonl")) as f:
    reqs = [json.loads(l) for l in f]
  prefilled = sum(r["prompt_len"] - r["cached_tokens"] for r in reqs if r["ttft_s"] is not None)
  tiers = s["tiers"]["roles"] if isinstance(s.get("tiers"), dict) else {}
  busy = {role: t.get("busy_fraction") for role, t in (tiers or {}).items()}
  return {"ttft_mean_ms": 1e3 * s["ttft_s"]["mean"], "ttft_p90_ms": 1e3 * s["ttft_s"]["p90"],
          "attainment": s["slo_attainment"], "tpot_mean_ms": 1e3 * (s["tpot_s"]["mean"] or 0), "prefilled_tokens": prefilled,
          "hit_tokens": s["kv_cache"]["hit_rate_tokens"],
          "decode_hit_tokens": s["kv_cache"]["decode_hit_tokens"],
          "kv_mib": s["kv_transfer"]["bytes"] / 2 ** 20, "busy": busy}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="experiments/prefix_cache/run")
  parser.add_argument("--scenario", default="decode_bound", choices=sorted(SCENARIOS))
  args = parser.parse_args()
  out = args.out if args.scenario == "decode_bound" else f"{args.out}_{args.scenario}"
  lines = ["| workload | setting | run | TTFT mean ms | TTFT p90 ms | attainment | prompt tokens "
           "prefilled | hit rate (tokens) | decode-side hit tokens | KV moved MiB | busy share |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  lines[0] = lines[0].replace("attainment |", "attainment | TPOT mean ms |")
  lines[1] += "---|"
  for wl, wflags in WORKLOADS.items():
    for name, sflags in SETTINGS.items():
      folder = os.path.join(out, wl, name.replace(", ", "_").replace(" ", "-"))
      cmd = [sys.executable, "-m", "pdjax.run", *BASE, *wflags, *SCENARIOS[args.scenario],
             *sflags, f"--workdir={folder}"]
      print("+", " ".join(cmd), file=sys.stderr, flush=True)
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
      for run in ("colocated", "chunked", "disaggregated"):
        r = row(folder, run)
        busy = ", ".join(f"{k} {v:.2f}" for k, v in r["busy"].items() if v is not None)
        lines.append(f"| {wl} | {name} | {run} | {r['ttft_mean_ms']:.1f} | {r['ttft_p90_ms']:.1f}"
                     f" | {100 * r['attainment']:.1f}% | {r['tpot_mean_ms']:.1f} | {r['prefilled_tokens']} | "
                     f"{100 * r['hit_tokens']:.1f}% | {r['decode_hit_tokens']} | "
                     f"{r['kv_mib']:.0f} | {busy} |")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
