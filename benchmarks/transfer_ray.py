"""Cross-process KV pull (cluster.launcher=ray) vs the in-process `transfer_kv`, same bytes and
TPs, in one run.

  python benchmarks/transfer_ray.py [--reps=15] [--layers=8] [--page-size=16] [--out=F.json]

For each source -> destination TP pair and page count k: the in-process transfer (two
sub-meshes of this process's 8 virtual CPU devices, `benchmarks/transfer.py`'s setup) and the
Ray path (a prefill and a decode actor, each its own process with its own virtual devices: the
source offers the pages on its jax.experimental.transfer server, the destination pulls them
and scatters them into its pool), each timed from dispatch until the pages have landed, as
the driver sees it; median of --reps after one warm-up. A transfer is one offer call and one
pull call, sent at once (one gather program on the source, one pull of all pieces, one scatter
program on the destination). "pull s" is the destination actor's own time from the pull call
to every piece arrived and the scatter dispatched; "call s" is, in the same run, the round trip
of an actor call that does nothing (`offer_counts`): the floor any cross-process transfer
pays on top of its bytes. GB/s = bytes needed / seconds. Only the transfer programs are
compiled (lazy step programs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PAIRS = ((2, 2), (2, 1), (1, 2))
PAGE_COUNTS = (1, 4, 16, 37, 64)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=15)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--page-size", type=int, default=16)
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()
  import jax
  import numpy as np
  from transfer import build_pair, median_s   # benchmarks/transfer.py
  from pdjax.distributed.launcher import RayCluster
  from pdjax.distributed.remote import ray_result
  from pdjax.engine import transfer
  from pdjax.engine.options import EngineOptions
  from pdjax.models.llama import init_params
  from pdjax.models.llama_config import PRESETS

  t0 = time.perf_counter()
  pages_per_seq = max(PAGE_COUNTS)
  mcfg = dataclasses.replace(PRESETS["tiny"], num_layers=args.layers)
  params = jax.tree_util.tree_map(np.asarray, init_params(mcfg, seed=0))
  opts = EngineOptions(page_size=args.page_size, num_pages=2 * pages_per_seq,
                       max_model_len=pages_per_seq * args.page_size, prefill_buckets=(32,),
                       max_prefill_seqs=1, decode_buckets=(1,), lazy_compile=True)
  rng = np.random.default_rng(0)
  rows = []
  with RayCluster(accelerator="cpu") as cluster:
    for src_tp, dst_tp in PAIRS:
      local_src, local_dst = build_pair(mcfg, params, opts, src_tp, dst_tp)
      src, dst = cluster.build_instances([("prefill", 1, src_tp), ("decode", 1, dst_tp)],
                                         mcfg, opts)
      for k in PAGE_COUNTS:
        sp = [int(p) for p in rng.permutation(opts.num_pages)[:k]]
        dp = [int(p) for p in rng.permutation(opts.num_pages)[:k]]
        needed = k * transfer.page_bytes(local_dst)
        local_s = median_s(lambda: transfer.transfer_kv(local_src, sp, local_dst, dp), args.reps)
        pulls = []

        def cross():
          pending = cluster.transfer_fn(src, sp, dst, dp)
          pulls.append(ray_result(pending.pull, dst.name))
        ray_s = median_s(cross, args.reps)
        call_s = median_s(lambda: ray_result(dst.actor.offer_counts.remote(), dst.name),
                          args.reps)
        assert pulls[-1]["bytes"] == needed, (pulls[-1], needed)
        pull_s = statistics.median(p["seconds"] for p in pulls[1:])
        rows.append({"src_tp": src_tp, "dst_tp": dst_tp, "pages": k, "bytes": needed,
                     "local_s": local_s, "local_gbps": needed / local_s / 1e9,
                     "ray_s": ray_s, "ray_gbps": needed / ray_s / 1e9, "pull_s": pull_s,
                     "call_s": call_s,
                     "ray_over_local": local_s / ray_s})
      cluster.release([src, dst])
  wall_s = time.perf_counter() - t0
  print(f"jax {jax.__version__}, ray {__import__('ray').__version__}, CPU; tiny Llama "
        f"{args.layers} layers, page {args.page_size} tokens; median of {args.reps}")
  print("| TP | pages | bytes | in-process s | GB/s | Ray pull s (driver) | GB/s "
        "| pull s (actor) | call s | Ray/in-process speed |")
  print("|" + "---|" * 10)
  for r in rows:
    print(f"| {r['src_tp']}->{r['dst_tp']} | {r['pages']} | {r['bytes']:,} "
          f"| {r['local_s']:.5f} | {r['local_gbps']:.3f} | {r['ray_s']:.5f} "
          f"| {r['ray_gbps']:.3f} | {r['pull_s']:.5f} | {r['call_s']:.5f} "
          f"| {r['ray_over_local']:.2f} |")
  print(f"wall time {wall_s:.1f} s")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"settings": vars(args), "wall_s": wall_s, "rows": rows}, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
