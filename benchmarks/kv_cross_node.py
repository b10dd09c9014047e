"""KV between two Ray nodes on this machine (issue 32): what sealing costs a P -> D transfer,
and a prefix reloaded from the other node's store against recomputing it.

  python benchmarks/kv_cross_node.py [--reps=4] [--requests=16]

Starts a two-node `ray.cluster_utils.Cluster` here (one machine: the "link" is loopback),
then runs, in this process, with one actor per instance:

  P -> D: the smoke config's model, 1 prefill and 1 decode instance (TP2) on the two nodes,
    `--requests` synthetic requests, kv.seal_cross_node off and on: per run the whole
    execute (actor start-up, compiles from the cache, serving), TTFT p50 and the mean KV
    transfer seconds; reps runs each, alternating, first pair dropped as warm-up, medians.
  Reload: the cross-node store trace (tests/helpers/remote_store_trace.py): two colocated
    instances, one per node; r3 = 64 tokens of prefix (48 reusable, in node 0's store) + 16
    new on node 1: its TTFT with kv.remote_store off (recompute), on, and on sealed (the
    trace run twice, the second r3 measured: programs all used once by then).

Prints the machine, jax and Ray versions beside each table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(overrides: dict):
  from pdjax import config as config_lib
  cfg = config_lib.load_config_module(os.path.join(ROOT, "pdjax", "configs", "default.py")
                                      ).get_config("smoke")
  cfg.backend, cfg.progress = "jax", False
  for key, value in {"cluster.launcher": "ray", "cluster.nodes": 2,
                     "cluster.transfer_host": "node", **overrides}.items():
    node = cfg
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    node[leaf] = value
  return cfg


def _run(cluster, overrides: dict, run: str):
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = _config(overrides)
  t0 = time.perf_counter()
  summary, result, _ = execute(cfg, config_lib.validate(cfg), run, None, quiet=True,
                               ray_cluster=cluster)
  wall = time.perf_counter() - t0
  assert summary["kv_pages_leaked"] == 0
  assert {r.status.value for r in result.requests} == {"finished"}
  return summary, result, wall


def _median_rows(rows: list[dict]) -> dict:
  return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=4)
  ap.add_argument("--requests", type=int, default=16)
  args = ap.parse_args()
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import jax
  import ray
  from ray.cluster_utils import Cluster

  from helpers.host_tier_trace import write_trace
  from helpers.remote_store_trace import remote_overrides, remote_rows
  from pdjax import config as config_lib
  from pdjax.distributed.launcher import RayCluster
  nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
  nodes.add_node(num_cpus=1)
  nodes.wait_for_nodes()
  print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"jax {jax.__version__}, ray {ray.__version__}; two Ray nodes on one machine")
  try:
    with tempfile.TemporaryDirectory() as tmp, RayCluster(
        address=nodes.address, accelerator="cpu", transfer_host="node",
        compile_cache_dir=os.path.join(tmp, "cache")) as cluster:
      pd = {"mode": "disaggregated", "cluster.prefill.instances": 1,
            "cluster.decode.instances": 1, "workload.num_requests": args.requests}
      rows = {False: [], True: []}
      for rep in range(args.reps):
        for sealed in (False, True):
          s, result, wall = _run(cluster, {**pd, "kv.seal_cross_node": sealed},
                                 "disaggregated")
          moved = [r.transfer_s for r in result.requests if r.transfer_s]
          if rep:
            rows[sealed].append({"command_s": wall, "ttft_p50_ms": 1e3 * s["ttft_s"]["p50"],
                                 "transfer_mean_ms": 1e3 * statistics.mean(moved),
                                 "bytes_per_transfer": statistics.mean(
                                     r.transfer_bytes for r in result.requests
                                     if r.transfer_bytes)})
      print(f"\nP -> D between the nodes: smoke model, 1P + 1D TP2, {args.requests} requests, "
            f"median of {args.reps - 1} runs (first dropped)\n")
      print("| sealed | whole execute s | TTFT p50 ms | transfer mean ms | bytes/transfer |")
      print("|---|---:|---:|---:|---:|")
      for sealed in (False, True):
        m = _median_rows(rows[sealed])
        print(f"| {sealed} | {m['command_s']:.2f} | {m['ttft_p50_ms']:.1f} | "
              f"{m['transfer_mean_ms']:.1f} | {m['bytes_per_transfer']:.0f} |")

      # The trace twice, the second time 10 s later with every token id shifted by one (a new
      # prefix): r7 is r3 in an instance that has run every program of the path once (a new
      # actor's first use of a program costs ~80 ms here, and would be all r3 measures).
      rows = remote_rows()
      rows += [dict(r, arrival_s=r["arrival_s"] + 10.0,
                    prompt_ids=[t + 1 for t in r["prompt_ids"]]) for r in remote_rows()]
      path = os.path.join(tmp, "remote.jsonl")
      write_trace(path, rows)
      ways = {"recompute (remote_store off)": {"kv.remote_store": False},
              "reload from node 0's store": {},
              "reload, sealed": {"kv.seal_cross_node": True}}
      ttft = {w: [] for w in ways}
      for rep in range(args.reps):
        for way, more in ways.items():
          _, result, _ = _run(cluster, remote_overrides(path, **{
              "scheduler.latency_profile": config_lib.DEFAULT_PROFILE,
              "workload.num_requests": 8, "kv.cross_node_latency_s": 0.0, **more}),
              "colocated")
          if rep:
            ttft[way].append(1e3 * result.requests[7].ttft_s)
            assert result.requests[7].cached_tokens == (0 if "off" in way else 48)
      print(f"\nr7's TTFT (r3 of the trace's second pass: 64-token prefix, 48 reusable in the "
            f"other node's store, 16 new; tiny model, TP2; kv.cross_node_latency_s=0, so the "
            f"reload is always taken), median of {args.reps - 1} runs (range)\n")
      print("| way | TTFT ms | range |")
      print("|---|---:|---|")
      for way, xs in ttft.items():
        print(f"| {way} | {statistics.median(xs):.1f} | {min(xs):.1f}-{max(xs):.1f} |")
  finally:
    nodes.shutdown()


if __name__ == "__main__":
  main()
