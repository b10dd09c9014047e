"""Moves a request's KV pages from a prefill instance's pool to a decode instance's pool.

Gather the pages on the source mesh, reshard there so that each destination device's slice of
kv heads sits whole on one source device, copy those single-device pieces device-to-device with
`jax.device_put`, assemble them into an array on the destination mesh and scatter it into pages
allocated there. Works when TP differs between the tiers (kv heads divide both degrees).

Why not `jax.device_put(gathered, dst_sharding)` directly: when the source's shard layout differs
from the destination's (another spec or TP degree), JAX falls back to
`shard_sharded_device_array_slow_path`, which may materialise the array on the host
(`x._value`). Single-device pieces always take the direct device-to-device copy.

A runtime failure (jax.errors.JaxRuntimeError) while dispatching or landing is raised as
`DeviceError`; a page-count mismatch or a size beyond the buckets stays a ValueError.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pdjax.engine import batch as batch_lib
from pdjax.engine import programs
from pdjax.engine.runtime import device_errors
from pdjax.kv.transfer_result import TransferResult

PAGES_SPEC = P(None, None, "tp")    # [2 (k|v), layers, kv_heads, n, page_size, head_dim]


def _piece_plan(src_devices, dst_tp: int):
  """Output shardings of the source-side reshard, and for each destination device j the
  (output index, source device) holding its kv-head slice."""
  src_tp = len(src_devices)
  if src_tp % dst_tp and dst_tp % src_tp:
    raise ValueError(f"cannot move KV from TP{src_tp} to TP{dst_tp}: neither divides the other")
  if src_tp >= dst_tp:    # group r source devices per destination slice (an all-gather there)
    r = src_tp // dst_tp
    mesh = Mesh(np.array(src_devices).reshape(dst_tp, r), ("dst", "rep"))
    return [NamedSharding(mesh, P(None, None, "dst"))], [(0, src_devices[j * r])
                                                         for j in range(dst_tp)]
  s = dst_tp // src_tp    # split each source shard into s outputs, one slice per output
  mesh = Mesh(np.array(src_devices), ("tp",))
  plan = [(j % s, src_devices[j // s]) for j in range(dst_tp)]
  return [NamedSharding(mesh, PAGES_SPEC)] * s, plan


def compile_gather(src, n: int, dst_tp: int):
  """Source program for n pages: gather, then reshard into destination-shaped pieces."""
  out_shardings, plan = _piece_plan(list(src.mesh.devices.flat), dst_tp)
  s = len(out_shardings)

  def gather(kv, page_ids):
    pages = programs.gather_pages(kv, page_ids)           # [2, L, KVH, n, ps, D]
    if s == 1:
      return (pages,)
    two, layers, kvh = pages.shape[:3]
    split = pages.reshape(two, layers, src.tp, s, kvh // dst_tp, *pages.shape[3:])
    return tuple(split[:, :, :, k].reshape(two, layers, -1, *pages.shape[3:]) for k in range(s))

  ids = np.zeros(n, np.int32)
  compiled = src._compile(gather, (src.kv, ids), (src._kv_sh, src._rep), tuple(out_shardings))
  return compiled, plan


def compile_scatter(dst, n: int):
  layers, kvh, _, ps, d = dst.kv_pool_shape
  pages = jax.ShapeDtypeStruct((2, layers, kvh, n, ps, d), dst.dtype)
  return dst._compile(programs.scatter_pages, (dst.kv, pages, np.zeros(n, np.int32)),
                      (dst._kv_sh, NamedSharding(dst.mesh, PAGES_SPEC), dst._rep), dst._kv_sh,
                      donate=(0,))


class PendingTransfer:
  """A transfer dispatched but maybe not landed: ready() once the pages are on the destination
  mesh; result() waits for that and reports bytes and seconds since dispatch (as observed:
  the scheduler polls, so this includes up to one loop turn)."""

  def __init__(self, pages, start: float):
    self.pages, self.start = pages, start
    self._seconds: float | None = None

  def ready(self) -> bool:
    with device_errors():
      if self._seconds is None and self.pages.is_ready():
        self._seconds = time.perf_counter() - self.start
    return self._seconds is not None

  def result(self) -> TransferResult:
    if self._seconds is None:
      with device_errors():
        self.pages.block_until_ready()
      self._seconds = time.perf_counter() - self.start
    return TransferResult(bytes=int(self.pages.nbytes), seconds=self._seconds)


def transfer_kv_async(src, src_pages: list[int], dst, dst_pages: list[int]) -> PendingTransfer:
  """Dispatches the copy of src_pages (source pool) into dst_pages (destination pool) and
  returns at once: the scheduler keeps stepping other instances while the pages move. The
  destination's pool is updated in dispatch order, so its later steps see the pages; the
  source pages must stay allocated until the transfer is ready."""
  if len(src_pages) != len(dst_pages):
    raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} destination")
  n = batch_lib.pick_bucket(src.opts.transfer_buckets, len(src_pages))
  return _dispatch(src, batch_lib.page_id_batch(src.geom, src_pages, n, pad_with_drop=False),
                   dst, batch_lib.page_id_batch(dst.geom, dst_pages, n, pad_with_drop=True))


def transfer_kv(src, src_pages: list[int], dst, dst_pages: list[int]) -> TransferResult:
  """Copies the KV in src_pages (source pool) into dst_pages (destination pool); returns once
  the pages have landed."""
  return transfer_kv_async(src, src_pages, dst, dst_pages).result()


def warm_up_transfers(src, dst) -> None:
  """Runs every transfer bucket once with destination ids all out of range (nothing written),
  so first-copy costs between these two sub-meshes fall in warm-up."""
  for n in src.opts.transfer_buckets:
    _move(src, np.zeros(n, np.int32), dst, np.full(n, dst.geom.num_pages, np.int32))


def _move(src, src_ids: np.ndarray, dst, dst_ids: np.ndarray) -> TransferResult:
  return _dispatch(src, src_ids, dst, dst_ids).result()


def _dispatch(src, src_ids: np.ndarray, dst, dst_ids: np.ndarray) -> PendingTransfer:
  start = time.perf_counter()
  n = len(src_ids)
  gather, plan = src._gather[(n, dst.tp)]
  layers, kvh, _, ps, d = dst.kv_pool_shape
  with device_errors():
    outs = gather(src.kv, src_ids)
    pieces = [next(s.data for s in outs[i].addressable_shards if s.device == device)
              for i, device in plan]
    moved = jax.device_put(pieces, list(dst.mesh.devices.flat))   # device -> device, per piece
    pages = jax.make_array_from_single_device_arrays(
        (2, layers, kvh, n, ps, d), NamedSharding(dst.mesh, PAGES_SPEC), moved)
    dst.kv = dst._scatter[n](dst.kv, pages, dst_ids)
  return PendingTransfer(pages, start)
