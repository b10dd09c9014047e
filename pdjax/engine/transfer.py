"""Moves a request's KV pages from a prefill instance's pool to a decode instance's pool.

Gather the pages on the source mesh, reshard there so that each destination device's slice of
kv heads sits whole on one source device, copy those single-device pieces device-to-device with
`jax.device_put`, assemble them into an array on the destination mesh and scatter it into pages
allocated there. Works when TP differs between the tiers (kv heads divide both degrees).

Why not `jax.device_put(gathered, dst_sharding)` directly: when the source's shard layout differs
from the destination's (another spec or TP degree), JAX falls back to
`shard_sharded_device_array_slow_path`, which may materialise the array on the host
(`x._value`). Single-device pieces always take the direct device-to-device copy.

Exact sizes, fixed shapes: every program is compiled ahead of time for the transfer buckets
(powers of two, then pages_per_seq), so a transfer of k pages is split into pieces whose sizes
are buckets and sum to k (`transfer_pieces`: 37 = 32 + 4 + 1), each piece gathered, copied and
scattered by its own bucket's programs. Only the pages needed move (padding one bucket would
move up to 2x), at the cost of one dispatch per piece (at most log2(pages_per_seq) + 1).

A runtime failure (jax.errors.JaxRuntimeError) while dispatching or landing is raised as
`DeviceError`; a page-count mismatch or a size beyond the buckets stays a ValueError.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs
from pdjax.engine.runtime import device_errors
from pdjax.kv.transfer_result import TransferResult

PAGES_SPEC = P(None, None, "tp")    # [2 (k|v), layers, kv_heads, n, page_size, head_dim]


def _check_tps(src_tp: int, dst_tp: int) -> None:
  if src_tp % dst_tp and dst_tp % src_tp:
    raise ValueError(f"cannot move KV from TP{src_tp} to TP{dst_tp}: neither divides the other")


def piece_shardings(src_mesh, dst_tp: int) -> list[NamedSharding]:
  """Output shardings of the source-side reshard (one per piece a source shard splits into).
  src_mesh: the source instance's Mesh, or an AbstractMesh of its size (export without
  devices): r = src_tp / dst_tp source devices grouped per destination slice (an all-gather
  there), or each source shard split into s = dst_tp / src_tp outputs."""
  src_tp = src_mesh.size
  _check_tps(src_tp, dst_tp)

  def mesh(shape, names):
    if isinstance(src_mesh, AbstractMesh):
      return AbstractMesh(shape, names)
    return Mesh(np.array(src_mesh.devices).reshape(shape), names)

  if src_tp >= dst_tp:
    grouped = mesh((dst_tp, src_tp // dst_tp), ("dst", "rep"))
    return [NamedSharding(grouped, P(None, None, "dst"))]
  return [NamedSharding(mesh((src_tp,), ("tp",)), PAGES_SPEC)] * (dst_tp // src_tp)


def _piece_plan(src_devices, dst_tp: int):
  """Output shardings of the source-side reshard, and for each destination device j the
  (output index, source device) holding its kv-head slice."""
  src_tp = len(src_devices)
  _check_tps(src_tp, dst_tp)
  shardings = piece_shardings(Mesh(np.array(src_devices), ("tp",)), dst_tp)
  if src_tp >= dst_tp:
    r = src_tp // dst_tp
    return shardings, [(0, src_devices[j * r]) for j in range(dst_tp)]
  s = dst_tp // src_tp
  return shardings, [(j % s, src_devices[j // s]) for j in range(dst_tp)]


def gather_function(src_tp: int, dst_tp: int):
  """The source program's body: (kv pools, page ids [n]) -> pieces, each [2, L, KVH, n, ps, D]
  laid out for `piece_shardings` (one piece, or a source shard's kv heads cut in
  dst_tp / src_tp)."""
  s = max(dst_tp // src_tp, 1)

  def gather(kv, page_ids):
    pages = programs.gather_pages(kv, page_ids)           # [2, L, KVH, n, ps, D]
    if s == 1:
      return (pages,)
    two, layers, kvh = pages.shape[:3]
    split = pages.reshape(two, layers, src_tp, s, kvh // dst_tp, *pages.shape[3:])
    return tuple(split[:, :, :, k].reshape(two, layers, -1, *pages.shape[3:]) for k in range(s))
  return gather


def compile_gather(src, n: int, dst_tp: int):
  """Source program for n pages: gather, then reshard into destination-shaped pieces."""
  out_shardings, plan = _piece_plan(list(src.mesh.devices.flat), dst_tp)
  ids = np.zeros(n, np.int32)
  compiled = src._compile(gather_function(src.tp, dst_tp), (src.kv, ids),
                          (src._kv_sh, src._rep), tuple(out_shardings))
  return compiled, plan


def scatter_shardings(mesh) -> tuple[tuple, tuple]:
  """(in, out) shardings of the destination program (kv pools, pages, page ids) -> kv pools."""
  kv = (NamedSharding(mesh, mesh_lib.kv_pool_spec()),) * 2
  return (kv, NamedSharding(mesh, PAGES_SPEC), mesh_lib.replicated(mesh)), kv


def compile_scatter(dst, n: int):
  layers, kvh, _, ps, d = dst.kv_pool_shape
  pages = jax.ShapeDtypeStruct((2, layers, kvh, n, ps, d), dst.dtype)
  in_sh, out_sh = scatter_shardings(dst.mesh)
  return dst._compile(programs.scatter_pages, (dst.kv, pages, np.zeros(n, np.int32)),
                      in_sh, out_sh, donate=(0,))


def transfer_pieces(buckets: tuple[int, ...], k: int) -> list[int]:
  """Bucket sizes summing to exactly k, largest first, fewest for power-of-two buckets (greedy:
  the largest bucket that fits, then the rest). buckets sorted ascending, starting at 1."""
  if k > buckets[-1]:
    raise ValueError(f"{k} exceeds the largest bucket {buckets[-1]}")
  pieces, left = [], k
  for size in reversed(buckets):
    while size <= left:
      pieces.append(size)
      left -= size
  if left:
    raise ValueError(f"{k} pages are not a sum of the buckets {buckets}")
  return pieces


class PendingTransfer:
  """A transfer dispatched but maybe not landed: ready() once every piece is on the destination
  mesh; result() waits for that and reports the bytes moved (all pieces) and seconds since
  dispatch (as observed: the scheduler polls, so this includes up to one loop turn).
  bytes_needed: what the pages asked for hold (None when not given)."""

  def __init__(self, pages, start: float, bytes_needed: int | None = None):
    self.pieces = list(pages) if isinstance(pages, (list, tuple)) else [pages]
    self.start, self.bytes_needed = start, bytes_needed
    self._seconds: float | None = None

  @property
  def bytes_moved(self) -> int:
    return sum(int(p.nbytes) for p in self.pieces)

  def ready(self) -> bool:
    with device_errors():
      if self._seconds is None and all(p.is_ready() for p in self.pieces):
        self._seconds = time.perf_counter() - self.start
    return self._seconds is not None

  def result(self) -> TransferResult:
    if self._seconds is None:
      with device_errors():
        for p in self.pieces:
          p.block_until_ready()
      self._seconds = time.perf_counter() - self.start
    return TransferResult(bytes=self.bytes_moved, seconds=self._seconds)


def transfer_kv_async(src, src_pages: list[int], dst, dst_pages: list[int]) -> PendingTransfer:
  """Dispatches the copy of src_pages (source pool) into dst_pages (destination pool) and
  returns at once: the scheduler keeps stepping other instances while the pages move. The
  destination's pool is updated in dispatch order, so its later steps see the pages; the
  source pages must stay allocated until the transfer is ready."""
  if len(src_pages) != len(dst_pages):
    raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} destination")
  sizes = transfer_pieces(src.opts.transfer_buckets, len(src_pages))
  bounds = np.cumsum([0] + sizes)
  src_ids, dst_ids = np.asarray(src_pages, np.int32), np.asarray(dst_pages, np.int32)
  pending = _dispatch(src, [src_ids[a:b] for a, b in zip(bounds, bounds[1:])],
                      dst, [dst_ids[a:b] for a, b in zip(bounds, bounds[1:])])
  pending.bytes_needed = len(src_pages) * page_bytes(dst)
  return pending


def transfer_kv(src, src_pages: list[int], dst, dst_pages: list[int]) -> TransferResult:
  """Copies the KV in src_pages (source pool) into dst_pages (destination pool); returns once
  the pages have landed."""
  return transfer_kv_async(src, src_pages, dst, dst_pages).result()


def page_bytes(inst) -> int:
  """Bytes of one page of an instance's pool: k and v, every layer and kv head."""
  layers, kvh, _, ps, d = inst.kv_pool_shape
  return 2 * layers * kvh * ps * d * np.dtype(inst.dtype).itemsize


def warm_up_transfers(src, dst) -> None:
  """Runs every transfer bucket once with destination ids all out of range (nothing written),
  so first-copy costs between these two sub-meshes fall in warm-up."""
  for n in src.opts.transfer_buckets:
    _dispatch(src, [np.zeros(n, np.int32)], dst,
              [np.full(n, dst.geom.num_pages, np.int32)]).result()


def _dispatch(src, src_ids: list[np.ndarray], dst, dst_ids: list[np.ndarray]) -> PendingTransfer:
  """One piece per (src_ids, dst_ids) pair, each of a bucket's size: every gather first, one
  device-to-device copy of all their single-device outputs, then each piece's scatter."""
  start = time.perf_counter()
  with device_errors():
    shards = gather_shards(src, src_ids, dst.tp)
    moved = jax.device_put(shards, list(dst.mesh.devices.flat) * len(src_ids))
    landed = land_shards(dst, moved, dst_ids)
  return PendingTransfer(landed, start)


def gather_shards(src, src_ids: list[np.ndarray], dst_tp: int) -> list:
  """Source half of a transfer: for each piece (a bucket's worth of page ids), the
  single-device arrays that destination devices 0..dst_tp-1 take whole, each
  [2, layers, kv_heads / dst_tp, n, page_size, head_dim] on one source device. Piece-major:
  piece p, destination device j is item p * dst_tp + j."""
  shards = []
  for ids in src_ids:
    gather, plan = src._gather[(len(ids), dst_tp)]
    outs = gather(src.kv, ids)
    shards += [next(s.data for s in outs[i].addressable_shards if s.device == device)
               for i, device in plan]
  return shards


def shard_shape(dst, n: int) -> tuple[int, ...]:
  """Shape of one destination device's part of an n-page piece."""
  layers, kvh, _, ps, d = dst.kv_pool_shape
  return (2, layers, kvh // dst.tp, n, ps, d)


def land_shards(dst, shards: list, dst_ids: list[np.ndarray]) -> list:
  """Destination half: assembles each piece from its single-device arrays (already on dst's
  devices, in `gather_shards`' order) and scatters it into dst's pool at dst_ids (ids out of
  range write nothing). Returns the assembled pieces (ready once landed)."""
  layers, kvh, _, ps, d = dst.kv_pool_shape
  per = dst.tp
  landed = []
  for p, ids in enumerate(dst_ids):
    n = len(ids)
    pages = jax.make_array_from_single_device_arrays(
        (2, layers, kvh, n, ps, d), NamedSharding(dst.mesh, PAGES_SPEC),
        shards[p * per:(p + 1) * per])
    dst.kv = dst._scatter[n](dst.kv, pages, ids)
    landed.append(pages)
  return landed
