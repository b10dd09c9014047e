"""Re-meshing against fixed placements on a workload whose phases flip (simulator).

  python benchmarks/remesh_phases.py [--model=llama3_8b] [--hardware=h100] [--phase-s=30]
      [--doc-phase-s=S] [--chat-phase-s=S] [--phases=4] [--doc-rate=3] [--chat-rate=12]
      [--doc-prompt=4096-7680] [--doc-out=64-256] [--chat-prompt=128-512] [--chat-out=128-512]
      [--prefill-chips=2] [--decode-chips=2] [--decode-buckets=8,16,32,64] [--kv-from-memory]
      [--start=2x1,2x1] [--schedule=decode:1x2@30,...] [--compile-s=1] [--ttft=2.0]
      [--tpot=0.04] [--cooldown=5] [--seeds=3] [--runs=NAME,...] [--reasons]

The workload (a JSONL trace written to a temporary file, seeded): phases alternate between
long documents (prompts --doc-prompt tokens, answers --doc-out, Poisson at --doc-rate, each
phase --doc-phase-s long) and short chats (--chat-prompt / --chat-out at --chat-rate, each
--chat-phase-s), starting with documents; lengths uniform in their ranges; every answer runs
to its length (no EOS). --phase-s is the length of both when those are not given.

Runs (roofline cost of --hardware, bfloat16) on --prefill-chips + --decode-chips chips: every
fixed disaggregated layout (each tier's chips in equal instances at every TP 1/2/4/8 dividing
them, the two TPs dividing one another), colocated and chunked at every TP over all the chips,
queue_balance role switching and `scheduler.role_switch=remesh` deciding from the load, both
from the --start layout (prefill,decode), and with --schedule the same re-meshes scripted (an
oracle: the phases' switch times known). Every run has the same settings: the largest decode
bucket is every instance's slot cap whatever its TP; with --kv-from-memory each instance's KV
pool is what its chips' HBM holds after the weights (0.9 of it; planning/capacity.py), else
8,192 pages at every TP. Printed per run: goodput per chip (requests meeting both SLOs per
second per chip), SLO attainment (of documents and chats apart), TTFT / TPOT p90, the
re-meshes made; means over --seeds with the min-max spread. The goal (issue 31): remesh >= 1.3
x the best fixed placement's goodput per chip, and above queue_balance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH wins


def write_trace(path: str, seed: int, args) -> int:
  """Phases alternate documents / chats (documents first), each phase --doc-phase-s or
  --chat-phase-s long (--phase-s when not given), Poisson arrivals at the phase's rate, lengths
  uniform in the phase's ranges."""
  import numpy as np
  rng = np.random.default_rng(seed)
  rows, start = [], 0.0
  for p in range(args.phases):
    docs = p % 2 == 0
    rate = args.doc_rate if docs else args.chat_rate
    length = (args.doc_phase_s if docs else args.chat_phase_s) or args.phase_s
    (plo, phi), (olo, ohi) = ((args.doc_prompt, args.doc_out) if docs
                              else (args.chat_prompt, args.chat_out))
    t = start + rng.exponential(1 / rate)
    while t < start + length:
      prompt, out = int(rng.integers(plo, phi + 1)), int(rng.integers(olo, ohi + 1))
      rows.append({"arrival_s": round(float(t), 6), "prompt_len": prompt, "output_len": out})
      t += rng.exponential(1 / rate)
    start += length
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return len(rows)


def _tps(chips: int, allowed=(1, 2, 4, 8)) -> list[int]:
  return [tp for tp in allowed if chips % tp == 0 and tp <= chips]


def make_runs(args) -> dict:
  """name -> spec: every fixed disaggregated layout of the two tiers (each tier's chips split
  into equal instances at each TP dividing them), colocated and chunked at each TP over all
  the chips, then queue_balance and remesh from --start (and the scheduled oracle with
  --schedule)."""
  pc, dc = args.prefill_chips, args.decode_chips
  runs = {}
  for ptp in _tps(pc):
    for dtp in _tps(dc):
      if ptp % dtp and dtp % ptp:
        continue
      runs[f"disagg P{pc // ptp}x{ptp} D{dc // dtp}x{dtp}"] = dict(
          mode="disaggregated", p=(pc // ptp, ptp), d=(dc // dtp, dtp))
  for kind in ("colocated", "chunked"):
    for tp in _tps(pc + dc):
      runs[f"{kind} {(pc + dc) // tp}x{tp}"] = dict(mode=kind, c=((pc + dc) // tp, tp))
  p, d = args.start.split(",")
  start = dict(mode="disaggregated", p=tuple(int(x) for x in p.split("x")),
               d=tuple(int(x) for x in d.split("x")))
  runs[f"queue_balance P{p} D{d}"] = dict(start, role_switch="queue_balance")
  runs[f"remesh P{p} D{d}"] = dict(start, role_switch="remesh")
  if args.schedule:
    runs[f"remesh scheduled P{p} D{d}"] = dict(start, role_switch="remesh",
                                               schedule=args.schedule)
  return runs


def _pages(cfg, mcfg, tp: int) -> int:
  """The KV pool of a TP instance from its chips' memory (the same per chip for every run)."""
  from pdjax.planning import capacity
  from pdjax.sim.hardware import HARDWARE
  pages = capacity.pool_pages(mcfg, HARDWARE[cfg.sim.hardware], tp,
                              page_size=cfg.kv.page_size, dtype_bytes=2, mem_util=0.9,
                              max_model_len=cfg.kv.max_model_len,
                              max_batch=max(cfg.scheduler.decode_buckets))
  if pages is None:
    raise SystemExit(f"{cfg.model.preset} does not fit TP{tp} on {cfg.sim.hardware}")
  return pages


def run_one(args, trace: str, seed: int, spec: dict) -> dict:
  from pdjax import config as config_lib
  from pdjax.configs.default import get_config
  from pdjax.models.llama_config import PRESETS
  from pdjax.runner.execute import execute
  cfg = get_config()
  cfg.backend, cfg.seed, cfg.repeats, cfg.progress = "sim", seed, 1, False
  cfg.mode = "colocated" if spec["mode"] == "chunked" else spec["mode"]
  cfg.model.preset, cfg.model.dtype = args.model, "bfloat16"
  cfg.sim.hardware = args.hardware
  cfg.sim.remesh_compile_s = args.compile_s
  cfg.workload.kind, cfg.workload.path = "jsonl", trace
  cfg.workload.num_requests = 10 ** 6
  cfg.workload.ignore_eos = True
  cfg.kv.max_model_len = args.max_model_len
  cfg.scheduler.prefill_buckets = (512, 2048, args.max_model_len)
  cfg.scheduler.decode_buckets = tuple(int(b) for b in args.decode_buckets.split(","))
  if args.kv_from_memory:
    mcfg0 = PRESETS[args.model]
    for role, key in (("prefill", "p"), ("decode", "d"), ("colocated", "c")):
      if key in spec:
        cfg.cluster[role].kv_pages = _pages(cfg, mcfg0, spec[key][1])
    cfg.kv.pages_per_instance = _pages(cfg, mcfg0, 1)
  else:
    cfg.kv.pages_per_instance = 8192
  cfg.slo.ttft_s, cfg.slo.tpot_s = args.ttft, args.tpot
  if "p" in spec:
    (cfg.cluster.prefill.instances, cfg.cluster.prefill.tp) = spec["p"]
    (cfg.cluster.decode.instances, cfg.cluster.decode.tp) = spec["d"]
  if "c" in spec:
    cfg.cluster.colocated.instances, cfg.cluster.colocated.tp = spec["c"]
  cfg.scheduler.role_switch = spec.get("role_switch", "none")
  cfg.scheduler.role_switch_interval_s = 1.0
  cfg.scheduler.remesh_cooldown_s = args.cooldown
  if spec.get("schedule"):
    cfg.scheduler.remesh_schedule = spec["schedule"]
  cfg.scheduler.length_threshold = 2048
  mcfg = config_lib.validate(cfg)
  summary, result, _ = execute(cfg, mcfg, spec["mode"], None, quiet=True)
  chips = args.prefill_chips + args.decode_chips
  from pdjax.metrics.summary import meets_slo
  kinds = {}   # "doc" / "chat" (the phase a request arrived in) -> [met, total]
  for r in result.requests:
    kind = "doc" if r.prompt_len >= args.doc_prompt[0] and args.doc_prompt[0] > \
        args.chat_prompt[1] else "chat"
    k = kinds.setdefault(kind, [0, 0])
    k[0] += meets_slo(r, args.ttft, args.tpot)
    k[1] += 1
  return {"by_kind": {k: v[0] / v[1] for k, v in kinds.items()},
          "goodput_chip": summary["goodput_rps"] / chips,
          "attainment": summary["slo_attainment"],
          "ttft_p90": summary["ttft_s"].get("p90"), "tpot_p90": summary["tpot_s"].get("p90"),
          "remeshes": [(round(e["t_s"], 1), e["role"], e["from"], e["to"])
                       for e in result.remesh_events],
          "reasons": [e["reason"] for e in result.remesh_events],
          "switches": len(result.role_switches)}


def _range(text: str) -> tuple[int, int]:
  lo, hi = text.split("-")
  return int(lo), int(hi)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="llama3_8b")
  ap.add_argument("--hardware", default="h100")
  ap.add_argument("--phase-s", type=float, default=30.0)
  ap.add_argument("--doc-phase-s", type=float, default=0.0, help="0: --phase-s")
  ap.add_argument("--chat-phase-s", type=float, default=0.0, help="0: --phase-s")
  ap.add_argument("--phases", type=int, default=4)
  ap.add_argument("--doc-rate", type=float, default=3.0)
  ap.add_argument("--chat-rate", type=float, default=12.0)
  ap.add_argument("--doc-prompt", type=_range, default=(4096, 7680))
  ap.add_argument("--doc-out", type=_range, default=(64, 256))
  ap.add_argument("--chat-prompt", type=_range, default=(128, 512))
  ap.add_argument("--chat-out", type=_range, default=(128, 512))
  ap.add_argument("--prefill-chips", type=int, default=2)
  ap.add_argument("--decode-chips", type=int, default=2)
  ap.add_argument("--decode-buckets", default="8,16,32,64",
                  help="decode batch buckets; the largest is every instance's slot cap")
  ap.add_argument("--max-model-len", type=int, default=8192)
  ap.add_argument("--kv-from-memory", action="store_true",
                  help="each instance's KV pool from its chips' HBM (0.9 of it, less the "
                       "weights; planning/capacity.py) instead of 8192 pages at every TP")
  ap.add_argument("--start", default="2x1,2x1",
                  help="prefill,decode layout queue_balance and remesh start from")
  ap.add_argument("--schedule", default="",
                  help="also run remesh with this scheduler.remesh_schedule (an oracle)")
  ap.add_argument("--compile-s", type=float, default=1.0, help="sim.remesh_compile_s")
  ap.add_argument("--ttft", type=float, default=2.0)
  ap.add_argument("--tpot", type=float, default=0.04)
  ap.add_argument("--cooldown", type=float, default=5.0)
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--reasons", action="store_true", help="print each re-mesh's reason")
  ap.add_argument("--runs", default="", help="comma-separated names (default: all)")
  args = ap.parse_args(argv)
  runs = make_runs(args)
  names = [n for n in runs if not args.runs or n in args.runs.split(",")]
  out: dict[str, list[dict]] = {n: [] for n in names}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in range(args.seeds):
      trace = os.path.join(tmp, f"phases_{seed}.jsonl")
      n = write_trace(trace, seed, args)
      for name in names:
        out[name].append(run_one(args, trace, seed, runs[name]))
  chips = args.prefill_chips + args.decode_chips
  print(f"# simulator, roofline {args.hardware}, {args.model} bfloat16, {chips} chips "
        f"(prefill {args.prefill_chips} + decode {args.decode_chips}); workload: "
        f"{args.phases} phases alternating documents ({args.doc_phase_s or args.phase_s:g} s, "
        f"prompt {args.doc_prompt[0]}-{args.doc_prompt[1]}, out {args.doc_out[0]}-"
        f"{args.doc_out[1]}, {args.doc_rate:g} req/s) and chats "
        f"({args.chat_phase_s or args.phase_s:g} s, prompt {args.chat_prompt[0]}-"
        f"{args.chat_prompt[1]}, out {args.chat_out[0]}-{args.chat_out[1]}, "
        f"{args.chat_rate:g} req/s), ~{n} requests per seed; decode buckets "
        f"{args.decode_buckets}; SLO TTFT {args.ttft:g} s, TPOT {args.tpot * 1e3:g} ms; "
        f"remesh compile {args.compile_s:g} s, cooldown {args.cooldown:g} s; "
        f"{args.seeds} seeds (mean, [min, max])")
  fixed = [n for n in names if not n.startswith(("queue_balance", "remesh"))]
  best_fixed = max((statistics.mean(r["goodput_chip"] for r in out[n]) for n in fixed),
                   default=float("nan"))
  for name in names:
    g = [r["goodput_chip"] for r in out[name]]
    att = statistics.mean(r["attainment"] for r in out[name])
    extra = ""
    if name.startswith("remesh"):
      extra = f"; re-meshes (seed 0): {out[name][0]['remeshes']}"
      if args.reasons:
        extra += "".join(f"\n    {t}: {why}" for (t, *_), why in
                         zip(out[name][0]["remeshes"], out[name][0]["reasons"]))
    if name.startswith("queue_balance"):
      extra = f"; role switches (seed 0): {out[name][0]['switches']}"
    print(f"{name:30s} goodput/chip {statistics.mean(g):6.3f} [{min(g):.3f}, {max(g):.3f}] "
          f"req/s  (x{statistics.mean(g) / best_fixed:.2f} of the best fixed)  "
          f"attainment {att:.3f} (docs {statistics.mean(r['by_kind'].get('doc', 0) for r in out[name]):.2f}, "
          f"chats {statistics.mean(r['by_kind'].get('chat', 0) for r in out[name]):.2f})  TTFT p90 {out[name][0]['ttft_p90']:.2f} s TPOT p90 "
          f"{out[name][0]['tpot_p90'] * 1e3:.1f} ms (seed 0){extra}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
