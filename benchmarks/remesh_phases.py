"""Re-meshing against fixed placements on a workload whose phases flip (simulator).

  python benchmarks/remesh_phases.py [--model=llama3_8b] [--hardware=h100] [--phase-s=30]
      [--phases=4] [--doc-rate=3] [--chat-rate=12] [--ttft=2.0] [--tpot=0.04] [--seeds=3]

The workload (a JSONL trace written to a temporary file, seeded): phases of --phase-s seconds
alternate between long documents (prompts 4,096-7,680 tokens, answers 64-256, Poisson at
--doc-rate) and short chats (prompts 128-512, answers 128-512, Poisson at --chat-rate),
starting with documents. Every answer runs to its length (no EOS). Four chips for
disaggregation (prefill 2 + decode 2) and the colocated baselines on the same four chips.

Runs (roofline cost of --hardware, bfloat16): every fixed disaggregated layout of the two
tiers (2x1 or 1x2 each), colocated 4x1 and 2x2, chunked 4x1, queue_balance role switching on
P 2x1 + D 2x1, and `scheduler.role_switch=remesh` deciding from the load on P 2x1 + D 2x1.
Printed per run: goodput per chip (requests meeting both SLOs per second per chip), SLO
attainment, TTFT / TPOT p90, the re-meshes made; means over --seeds with the min-max spread.
The goal (issue 31): remesh >= 1.3 x the best fixed placement's goodput per chip, and above
queue_balance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH wins


def write_trace(path: str, seed: int, phase_s: float, phases: int, doc_rate: float,
                chat_rate: float) -> int:
  import numpy as np
  rng = np.random.default_rng(seed)
  rows = []
  for p in range(phases):
    docs = p % 2 == 0
    rate = doc_rate if docs else chat_rate
    t = p * phase_s + rng.exponential(1 / rate)
    while t < (p + 1) * phase_s:
      if docs:
        prompt, out = int(rng.integers(4096, 7681)), int(rng.integers(64, 257))
      else:
        prompt, out = int(rng.integers(128, 513)), int(rng.integers(128, 513))
      rows.append({"arrival_s": round(float(t), 6), "prompt_len": prompt, "output_len": out})
      t += rng.exponential(1 / rate)
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return len(rows)


RUNS = {   # name -> config overrides
    "disagg P2x1 D2x1": dict(mode="disaggregated", p=(2, 1), d=(2, 1)),
    "disagg P1x2 D2x1": dict(mode="disaggregated", p=(1, 2), d=(2, 1)),
    "disagg P2x1 D1x2": dict(mode="disaggregated", p=(2, 1), d=(1, 2)),
    "disagg P1x2 D1x2": dict(mode="disaggregated", p=(1, 2), d=(1, 2)),
    "colocated 4x1": dict(mode="colocated", c=(4, 1)),
    "colocated 2x2": dict(mode="colocated", c=(2, 2)),
    "chunked 4x1": dict(mode="chunked", c=(4, 1)),
    "queue_balance P2x1 D2x1": dict(mode="disaggregated", p=(2, 1), d=(2, 1),
                                    role_switch="queue_balance"),
    "remesh P2x1 D2x1": dict(mode="disaggregated", p=(2, 1), d=(2, 1), role_switch="remesh"),
}


def run_one(args, trace: str, seed: int, spec: dict) -> dict:
  from pdjax import config as config_lib
  from pdjax.configs.default import get_config
  from pdjax.runner.execute import execute
  cfg = get_config()
  cfg.backend, cfg.seed, cfg.repeats, cfg.progress = "sim", seed, 1, False
  cfg.mode = "colocated" if spec["mode"] == "chunked" else spec["mode"]
  cfg.model.preset, cfg.model.dtype = args.model, "bfloat16"
  cfg.sim.hardware = args.hardware
  cfg.workload.kind, cfg.workload.path = "jsonl", trace
  cfg.workload.num_requests = 10 ** 6
  cfg.workload.ignore_eos = True
  cfg.kv.max_model_len = 8192
  cfg.kv.pages_per_instance = 8192
  cfg.scheduler.prefill_buckets = (512, 2048, 8192)
  cfg.scheduler.decode_buckets = (8, 16, 32, 64)
  cfg.slo.ttft_s, cfg.slo.tpot_s = args.ttft, args.tpot
  if "p" in spec:
    (cfg.cluster.prefill.instances, cfg.cluster.prefill.tp) = spec["p"]
    (cfg.cluster.decode.instances, cfg.cluster.decode.tp) = spec["d"]
  if "c" in spec:
    cfg.cluster.colocated.instances, cfg.cluster.colocated.tp = spec["c"]
  cfg.scheduler.role_switch = spec.get("role_switch", "none")
  cfg.scheduler.role_switch_interval_s = 1.0
  cfg.scheduler.remesh_cooldown_s = args.cooldown
  cfg.scheduler.length_threshold = 2048
  mcfg = config_lib.validate(cfg)
  summary, result, _ = execute(cfg, mcfg, spec["mode"], None, quiet=True)
  chips = 4
  return {"goodput_chip": summary["goodput_rps"] / chips,
          "attainment": summary["slo_attainment"],
          "ttft_p90": summary["ttft_s"].get("p90"), "tpot_p90": summary["tpot_s"].get("p90"),
          "remeshes": [(round(e["t_s"], 1), e["role"], e["from"], e["to"])
                       for e in result.remesh_events],
          "switches": len(result.role_switches)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="llama3_8b")
  ap.add_argument("--hardware", default="h100")
  ap.add_argument("--phase-s", type=float, default=30.0)
  ap.add_argument("--phases", type=int, default=4)
  ap.add_argument("--doc-rate", type=float, default=3.0)
  ap.add_argument("--chat-rate", type=float, default=12.0)
  ap.add_argument("--ttft", type=float, default=2.0)
  ap.add_argument("--tpot", type=float, default=0.04)
  ap.add_argument("--cooldown", type=float, default=5.0)
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--runs", default="", help="comma-separated names (default: all)")
  args = ap.parse_args(argv)
  names = [n for n in RUNS if not args.runs or n in args.runs.split(",")]
  out: dict[str, list[dict]] = {n: [] for n in names}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in range(args.seeds):
      trace = os.path.join(tmp, f"phases_{seed}.jsonl")
      n = write_trace(trace, seed, args.phase_s, args.phases, args.doc_rate, args.chat_rate)
      for name in names:
        out[name].append(run_one(args, trace, seed, RUNS[name]))
  print(f"# simulator, roofline {args.hardware}, {args.model} bfloat16, 4 chips; workload: "
        f"{args.phases} phases of {args.phase_s:g} s alternating documents (4-7.5k prompt, "
        f"64-256 out, {args.doc_rate:g} req/s) and chats (128-512 / 128-512, "
        f"{args.chat_rate:g} req/s), ~{n} requests per seed; SLO TTFT {args.ttft:g} s, TPOT "
        f"{args.tpot * 1e3:g} ms; {args.seeds} seeds (mean, [min, max])")
  best_fixed = max(statistics.mean(r["goodput_chip"] for r in out[n]) for n in names
                   if not n.startswith(("queue_balance", "remesh")))
  for name in names:
    g = [r["goodput_chip"] for r in out[name]]
    att = statistics.mean(r["attainment"] for r in out[name])
    extra = ""
    if name.startswith("remesh"):
      extra = f"; re-meshes (seed 0): {out[name][0]['remeshes']}"
    if name.startswith("queue_balance"):
      extra = f"; role switches (seed 0): {out[name][0]['switches']}"
    print(f"{name:26s} goodput/chip {statistics.mean(g):6.3f} [{min(g):.3f}, {max(g):.3f}] "
          f"req/s  (x{statistics.mean(g) / best_fixed:.2f} of the best fixed)  "
          f"attainment {att:.3f}{extra}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
