"""What a run writes: its folder (config.json, requests.jsonl, summary.json, report.md,
trace.json, plots/), mode=compare's compare.md, and the default output folder's name."""

from __future__ import annotations

import json
import os
import time


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  return os.path.join("results", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def write_outputs(workdir: str, cfg, run: str, summary: dict, result,
                  requests_written: bool = False) -> None:
  """One run's folder: config.json, requests.jsonl, summary.json, report.md, trace.json and
  plots/ (pdjax.run and pdjax.serve write the same; requests_written: pdjax.serve wrote
  requests.jsonl as its requests ended)."""
  from pdjax.metrics import plots
  from pdjax.metrics.report import write_run_files
  from pdjax.metrics.trace import write_chrome_trace
  write_run_files(workdir, config_dict={**cfg.to_dict(), "mode": run},
                  requests=None if requests_written else result.requests, summary=summary)
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  if summary.get("kv_cache", {}).get("enabled"):   # (kv/audit.py: with the prefix cache on)
    with open(os.path.join(workdir, "kv_audit.jsonl"), "w") as f:
      f.writelines(json.dumps(line) + "\n" for line in result.kv_audit)
  node_of = node_of_instances(cfg, run)
  host = summary.get("kv_cache", {}).get("host_tier")
  if host is not None:
    plots.plot_kv_store(result.samples, host["capacity_pages"],
                        os.path.join(workdir, "plots", "kv_store.png"), node_of)
  plots.plot_latency_cdfs({run: result.requests}, os.path.join(workdir, "plots", "latency_cdf.png"))
  plots.plot_tier_timeline(result.steps, result.samples, result.role_switches,
                           os.path.join(workdir, "plots", "tier_timeline.png"))
  full = cfg.get("output", {}).get("trace_steps", "auto") == "full"
  write_chrome_trace(os.path.join(workdir, "trace.json"), requests=result.requests,
                     steps=result.steps, role_switches=result.role_switches,
                     samples=result.samples, remeshes=result.remesh_events, node_of=node_of,
                     **({"max_step_events": None} if full else {}))


def node_of_instances(cfg, run: str) -> dict | None:
  """{instance name: node} of a run with cluster.nodes > 1 (the build order's even blocks:
  kv/remote_store.nodes_of, as runner/build.py places them); None with one node."""
  nodes = cfg.cluster.get("nodes", 1)
  if nodes == 1:
    return None
  from pdjax import config as config_lib
  from pdjax.kv.remote_store import nodes_of
  names = [f"{role}-{i}" for role, n, _ in config_lib.tiers(cfg)[config_lib.RUNS[run]]
           for i in range(n)]
  return dict(zip(names, nodes_of(len(names), nodes)))


def write_comparison(workdir: str, summaries: dict, results: dict) -> None:
  """compare.md (what ran, a conclusion, the side-by-side table and, per prompt-length
  bucket, the net benefit of disaggregation against the plain colocated run, pooled over
  repeats) and plots/latency_cdf.png for all runs (first repeat). results: {run: [RunResult
  per repeat]}."""
  from pdjax.metrics import plots
  from pdjax.metrics.benefit import net_benefit_pooled
  from pdjax.metrics.compare import write_compare_report
  benefit = None
  if "colocated" in results and "disaggregated" in results:
    pairs = [(c.requests, d.requests)
             for c, d in zip(results["colocated"], results["disaggregated"])]
    benefit = net_benefit_pooled(pairs, BENEFIT_BUCKETS)
  write_compare_report(os.path.join(workdir, "compare.md"), summaries, benefit)
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  plots.plot_latency_cdfs({run: r[0].requests for run, r in results.items()},
                          os.path.join(workdir, "plots", "latency_cdf.png"))


BENEFIT_BUCKETS = [0, 64, 128, 256, 512, 1024, 4096]
