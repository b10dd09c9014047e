"""KV transfer cost vs the limit: bytes moved vs bytes needed, and the speed of `transfer_kv`
vs a plain device-to-device copy of the same bytes between the same devices.

  python benchmarks/transfer.py [--reps=15] [--layers=8] [--page-size=16] [--out=transfer.json]

On 8 simulated CPU devices, for each source -> destination TP pair (disjoint sub-meshes) and
each page count k, times `transfer_kv` of k random pages (after warm-up; median of --reps) and,
in the same run, the plain copy: for each destination device, one array of the bytes that
device receives, `jax.device_put` from the source device the transfer takes that slice from
(`transfer._piece_plan`), blocked until ready. Also in the same run, the transfer's two
programs alone (blocked until done): the source's gather and the destination's scatter, so
the table shows what is left once the bytes are moved (on a CPU host, gather and scatter are
memory copies too). The model is the `tiny` Llama with --layers layers (4 kv heads of 16
dims); only the transfer programs are compiled.

Columns: pages; pieces (the sizes of the arrays the one copy moves, summing to k); bytes
needed (k pages of the destination pool) and moved (TransferResult.bytes); their ratio; the
transfer's median seconds and GB/s (needed bytes / seconds); the plain copy's GB/s; transfer
/ plain GB/s; the gather and scatter programs' own median seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

PAIRS = ((2, 2), (4, 2), (1, 2))
PAGE_COUNTS = (1, 2, 4, 8, 16, 32, 37, 64)


def build_pair(mcfg, params, opts, src_tp: int, dst_tp: int):
  """A source and a destination instance on disjoint devices with only the transfer programs
  compiled and warmed up."""
  import jax
  from pdjax.engine import mesh as mesh_lib
  from pdjax.engine import transfer
  from pdjax.engine.instance import Instance
  specs = mesh_lib.split_devices(jax.devices(), [("prefill", 1, src_tp), ("decode", 1, dst_tp)])
  src, dst = (Instance(spec, mcfg, params, opts) for spec in specs)
  src.warm_up(prefill=False, decode=False, transfer_to_tp=(dst_tp,))
  dst.warm_up(prefill=False, decode=False, receive=True)
  transfer.warm_up_transfers(src, dst)
  return src, dst


def median_s(fn, reps: int) -> float:
  fn()   # warm-up: first-copy costs of these buffers and devices
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def plain_copy(src, dst, nbytes: int):
  """A function copying nbytes, split evenly over the destination devices, each slice from
  the source device that `transfer_kv` takes it from, and waiting for it to land."""
  import jax
  import numpy as np
  from pdjax.engine import transfer
  _, plan = transfer._piece_plan(list(src.mesh.devices.flat), dst.tp)
  dst_devices = list(dst.mesh.devices.flat)
  per_device = np.zeros(nbytes // 4 // dst.tp, np.float32)
  sources = [jax.device_put(per_device, device) for _, device in plan]
  jax.block_until_ready(sources)

  def copy():
    jax.block_until_ready(jax.device_put(sources, dst_devices))
  return copy


def measure(src, dst, pages: int, reps: int, rng) -> dict:
  from pdjax.engine import transfer
  src_pages = [int(p) for p in rng.permutation(src.geom.num_pages)[:pages]]
  dst_pages = [int(p) for p in rng.permutation(dst.geom.num_pages)[:pages]]
  pending = transfer.transfer_kv_async(src, src_pages, dst, dst_pages)
  moved = pending.result().bytes
  needed = pending.bytes_needed
  xfer_s = median_s(lambda: transfer.transfer_kv(src, src_pages, dst, dst_pages), reps)
  plain_s = median_s(plain_copy(src, dst, needed), reps)
  gather_s, scatter_s = program_seconds(src, dst, src_pages, reps)
  pieces = transfer.transfer_pieces(src.opts.transfer_buckets, pages)
  return {"src_tp": src.tp, "dst_tp": dst.tp, "pages": pages,
          "pieces": "+".join(map(str, pieces)), "bytes_needed": needed, "bytes_moved": moved,
          "moved_over_needed": moved / needed, "seconds": xfer_s, "gbps": needed / xfer_s / 1e9,
          "plain_seconds": plain_s, "plain_gbps": needed / plain_s / 1e9,
          "transfer_over_plain": plain_s / xfer_s, "gather_seconds": gather_s,
          "scatter_seconds": scatter_s}


def program_seconds(src, dst, src_pages: list[int], reps: int) -> tuple[float, float]:
  """Median seconds of the transfer's gather program alone and of its scatter program alone
  (destination ids out of range: nothing written), each blocked until done."""
  import jax
  from pdjax.engine import transfer
  plan = transfer.transfer_plan(src.opts.transfer_buckets, len(src_pages))
  gather, _ = src._gather[(plan.bucket, dst.tp)]
  ids = plan.ids(src_pages, transfer.EMPTY)
  gather_s = median_s(lambda: jax.block_until_ready(gather(src.kv, ids)), reps)
  shards = jax.device_put(transfer.gather_shards(src, src_pages, dst.tp),
                          transfer._destinations(dst, len(plan.pieces) * dst.tp))
  nowhere = [dst.geom.num_pages] * len(src_pages)

  def scatter():
    transfer.land_shards(dst, shards, nowhere)
    jax.block_until_ready(dst.kv)
  return gather_s, median_s(scatter, reps)


def markdown(rows: list[dict]) -> str:
  head = ("| TP | pages | pieces | bytes needed | bytes moved | moved/needed | median s "
          "| GB/s | plain GB/s | transfer/plain | gather s | scatter s |")
  lines = [head, "|" + "---|" * 12]
  for r in rows:
    lines.append(f"| {r['src_tp']}->{r['dst_tp']} | {r['pages']} | {r['pieces']} "
                 f"| {r['bytes_needed']:,} | {r['bytes_moved']:,} "
                 f"| {r['moved_over_needed']:.2f} | {r['seconds']:.6f} | {r['gbps']:.3f} "
                 f"| {r['plain_gbps']:.3f} | {r['transfer_over_plain']:.2f} "
                 f"| {r['gather_seconds']:.6f} | {r['scatter_seconds']:.6f} |")
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=15, help="timed repetitions per row (median)")
  ap.add_argument("--layers", type=int, default=8, help="layers of the tiny Llama")
  ap.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
  ap.add_argument("--pages-per-seq", type=int, default=64, help="largest transfer bucket")
  ap.add_argument("--out", default="", help="also write the rows (and settings) as JSON here")
  args = ap.parse_args()
  if args.pages_per_seq < max(PAGE_COUNTS):
    ap.error(f"--pages-per-seq must be >= {max(PAGE_COUNTS)}")

  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()
  import jax
  import numpy as np
  from pdjax.engine.options import EngineOptions
  from pdjax.models.llama import init_params
  from pdjax.models.llama_config import PRESETS

  t0 = time.perf_counter()
  mcfg = dataclasses.replace(PRESETS["tiny"], num_layers=args.layers)
  params = jax.tree_util.tree_map(np.asarray, init_params(mcfg, seed=0))
  opts = EngineOptions(page_size=args.page_size, num_pages=2 * args.pages_per_seq,
                       max_model_len=args.pages_per_seq * args.page_size,
                       prefill_buckets=(32,), max_prefill_seqs=1, decode_buckets=(1,))
  rng = np.random.default_rng(0)
  rows = []
  for src_tp, dst_tp in PAIRS:
    src, dst = build_pair(mcfg, params, opts, src_tp, dst_tp)
    rows += [measure(src, dst, k, args.reps, rng) for k in PAGE_COUNTS]
  wall_s = time.perf_counter() - t0
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}; "
        f"tiny Llama, {args.layers} layers, page {args.page_size} tokens, transfer buckets "
        f"{opts.transfer_buckets}; median of {args.reps}")
  print(markdown(rows))
  print(f"wall time {wall_s:.1f} s")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"settings": vars(args) | {"transfer_buckets": list(opts.transfer_buckets)},
                 "wall_s": wall_s, "rows": rows}, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
