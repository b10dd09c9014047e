"""Moves a request's KV pages from a prefill instance's pool to a decode instance's pool.

One transfer, one program on each side: a gather program on the source mesh gathers the pages
and reshards them so that each destination device's slice of kv heads sits whole on one source
device; one `jax.device_put` copies those single-device pieces device-to-device; they are
assembled into arrays on the destination mesh and one scatter program writes them into the
pages allocated there. Works when TP differs between the tiers (kv heads divide both degrees).

Why not `jax.device_put(gathered, dst_sharding)` directly: when the source's shard layout differs
from the destination's (another spec or TP degree), JAX falls back to
`shard_sharded_device_array_slow_path`, which may materialise the array on the host
(`x._value`). Single-device pieces always take the direct device-to-device copy.

Exact sizes, fixed shapes: the programs are compiled ahead of time per transfer bucket (powers
of two, then pages_per_seq), each working on fixed slots of the bucket's page ids
(`transfer_plan`: 37 pages go through bucket 32's programs as the slots 32 + 4 + 1). Only
the filled slots are copied, so exactly the pages needed move; the gather outputs zeros for
the empty ones and the scatter skips them (a `lax.cond` each, on the slot's first id), taking
a blank, never read, in their place. Before issue 28 each piece had its own gather, copy and
scatter (three dispatches per piece). On a CPU host the gather and scatter programs' own
memory work is most of a transfer either way (BENCHMARKS.md, issue 28); without the conds the
empty slots' gathering and scattering cost more there than the dispatches saved. (XLA:GPU
may read a conditional's predicate on the host; measure before relying on this on a GPU.)

A runtime failure (jax.errors.JaxRuntimeError) while dispatching or landing is raised as
`DeviceError`; a page-count mismatch or a size beyond the buckets stays a ValueError.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs
from pdjax.engine import ready_wait
from pdjax.engine.runtime import device_errors
from pdjax.engine.transfer_plan import (Plan, slot_sizes, transfer_pieces,  # noqa: F401
                                        transfer_plan)
from pdjax.kv.transfer_result import TransferResult

PAGES_SPEC = P(None, None, "tp")    # [2 (k|v), layers, kv_heads, n, page_size, head_dim]
EMPTY = -1                           # the source page id of an empty slot (not gathered)


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


@functools.lru_cache(maxsize=256)   # one function per program: jax reuses its trace
def gather_function(src_tp: int, dst_tp: int, slots: tuple[int, ...],
                    layers: tuple[int, int] | None = None):
  """The source program's body: (kv pools, page ids [sum(slots)]) -> for each slot (in order),
  its pages [2, L, KVH, n, ps, D] laid out for `piece_shardings` (one array, or a source
  shard's kv heads cut in dst_tp / src_tp). Each slot is gathered straight from the pools (no
  bucket-sized intermediate); a slot after the first whose first id is negative is empty
  (`Plan.ids(..., EMPTY)`): it is zeros, not gathered (on a CPU host gathering it cost as
  much as the pages it would have moved). layers=(a, b): those layers only (a layer group's
  KV, streamed: engine/layer_groups.py)."""
  s = max(dst_tp // src_tp, 1)
  offsets = np.cumsum((0,) + tuple(slots))

  def gather(kv, page_ids):
    out = []
    for i, (a, n) in enumerate(zip(offsets, slots)):
      ids = page_ids[a:a + n]
      if i == 0:
        pages = programs.gather_pages(kv, ids, layers)         # [2, L, KVH, n, ps, D]
      else:
        num_layers, kvh, _, ps, d = kv[0].shape
        if layers is not None:
          num_layers = layers[1] - layers[0]
        pages = jax.lax.cond(
            ids[0] >= 0, lambda ids=ids: programs.gather_pages(kv, ids, layers),
            lambda n=n: jnp.zeros((2, num_layers, kvh, n, ps, d), kv[0].dtype))
      if s == 1:
        out.append(pages)
        continue
      two, num_layers, kvh = pages.shape[:3]
      split = pages.reshape(two, num_layers, src_tp, s, kvh // dst_tp, *pages.shape[3:])
      out += [split[:, :, :, j].reshape(two, num_layers, -1, *pages.shape[3:])
              for j in range(s)]
    return tuple(out)
  return gather


def gather_shardings(src_mesh, dst_tp: int, slots: tuple[int, ...]) -> tuple:
  """Output shardings of `gather_function`: `piece_shardings` for each slot."""
  return tuple(piece_shardings(src_mesh, dst_tp)) * len(slots)


def compile_gather(src, b: int, dst_tp: int, layers: tuple[int, int] | None = None):
  """Source program of bucket b: gather its slots, resharded into destination-shaped pieces.
  Returns (program, route): route[j] = (output index within a slot, source device) of
  destination device j's slice. layers: a layer group's (None: every layer)."""
  slots = slot_sizes(src.opts.transfer_buckets, b)
  _, route = _piece_plan(list(src.mesh.devices.flat), dst_tp)
  compiled = src._compile(gather_function(src.tp, dst_tp, slots, layers),
                          (src.kv, np.zeros(sum(slots), np.int32)),
                          (src._kv_sh, src._rep),
                          gather_shardings(src.mesh, dst_tp, slots))
  return compiled, route


@functools.lru_cache(maxsize=256)   # one function per program: jax reuses its trace
def scatter_function(slots: tuple[int, ...], layers: tuple[int, int] | None = None):
  """The destination program's body: (kv pools, pieces, page ids [sum(slots)]) -> kv pools,
  each slot's piece [2, L, KVH, n, ps, D] written at its ids (out-of-range ids dropped; a
  slot after the first whose first id is out of range is skipped, its blank never read).
  pieces: one array per slot; a one-slot bucket's program is `programs.scatter_pages`
  itself (pieces a bare array). layers=(a, b): the pieces hold those layers only."""
  if len(slots) == 1:
    return lambda kv, pages, ids: programs.scatter_pages(kv, pages, ids, layers)
  offsets = np.cumsum((0,) + tuple(slots))

  def scatter(kv, pieces, page_ids):
    for i, (a, n, pages) in enumerate(zip(offsets, slots, pieces)):
      ids = page_ids[a:a + n]
      if i == 0:
        kv = programs.scatter_pages(kv, pages, ids, layers)
      else:
        kv = jax.lax.cond(ids[0] < kv[0].shape[2],
                          lambda kv, pages=pages, ids=ids: programs.scatter_pages(kv, pages, ids,
                                                                                  layers),
                          lambda kv: kv, kv)
    return kv
  return scatter


def scatter_shardings(mesh, num_slots: int = 1) -> tuple[tuple, tuple]:
  """(in, out) shardings of the destination program (kv pools, pieces, page ids) -> kv pools."""
  kv = (NamedSharding(mesh, mesh_lib.kv_pool_spec()),) * 2
  piece = NamedSharding(mesh, PAGES_SPEC)
  pieces = piece if num_slots == 1 else (piece,) * num_slots
  return (kv, pieces, mesh_lib.replicated(mesh)), kv


def compile_scatter(dst, b: int, known: dict | None = None,
                    layers: tuple[int, int] | None = None):
  """Destination program of bucket b, pools donated. Returns (program, blanks): blanks[i] is
  an array of slot i's shape on dst's mesh that stands in for a slot a transfer leaves empty
  (its ids are out of range, so it is never written); None for slot 0, always filled.
  known: blanks by size to reuse (default: those of dst's other scatter programs; a layer
  group's program (layers=(a, b)) must be given those of its own group size)."""
  slots = slot_sizes(dst.opts.transfer_buckets, b)
  num_layers, kvh, _, ps, d = dst.kv_pool_shape
  if layers is not None:
    num_layers = layers[1] - layers[0]
    if known is None:
      raise ValueError("a layer group's scatter needs its own blanks (known)")
  shape = lambda n: (2, num_layers, kvh, n, ps, d)   # noqa: E731
  args = tuple(jax.ShapeDtypeStruct(shape(n), dst.dtype) for n in slots)
  in_sh, out_sh = scatter_shardings(dst.mesh, len(slots))
  compiled = dst._compile(scatter_function(slots, layers), (dst.kv, args[0] if len(slots) == 1 else args,
                                                    np.zeros(sum(slots), np.int32)),
                          in_sh, out_sh, donate=(0,))
  if known is None:
    known = {x.shape[3]: x for _, blanks in getattr(dst, "_scatter", {}).values()
             for x in blanks if x is not None}
  sharding = NamedSharding(dst.mesh, PAGES_SPEC)
  blanks = [None]
  for n in slots[1:]:
    if n not in known:
      known[n] = jax.device_put(np.zeros(shape(n), dst.dtype), sharding)
    blanks.append(known[n])
  return compiled, tuple(blanks)


class PendingTransfer:
  """A transfer dispatched but maybe not landed: ready() once every piece is on the destination
  mesh; result() waits for that and reports the bytes moved (all pieces) and seconds since
  dispatch (as observed: the scheduler polls, so this includes up to one loop turn).
  bytes_needed: what the pages asked for hold (None when not given)."""

  def __init__(self, pages, start: float, bytes_needed: int | None = None):
    self.pieces = list(pages) if isinstance(pages, (list, tuple)) else [pages]
    self.start, self.bytes_needed = start, bytes_needed
    self._seconds: float | None = None

  wait_any = staticmethod(ready_wait.wait_any)

  def arrays_to_wait(self) -> list:
    return self.pieces

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


def transfer_kv_async(src, src_pages: list[int], dst, dst_pages: list[int],
                      layers: tuple[int, int] | None = None) -> PendingTransfer:
  """Dispatches the copy of src_pages (source pool) into dst_pages (destination pool) and
  returns at once: the scheduler keeps stepping other instances while the pages move. The
  destination's pool is updated in dispatch order, so its later steps see the pages; the
  source pages must stay allocated until the transfer is ready. layers=(a, b): only those
  layers' KV (a layer group, streamed while the next group computes: engine/layer_groups.py)."""
  if len(src_pages) != len(dst_pages):
    raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} destination")
  start = time.perf_counter()
  with device_errors():
    shards = gather_shards(src, src_pages, dst.tp, layers)
    moved = jax.device_put(shards, _destinations(dst, len(shards)))
    landed = land_shards(dst, moved, dst_pages, layers)
  share = 1.0 if layers is None else (layers[1] - layers[0]) / dst.kv_pool_shape[0]
  return PendingTransfer(landed, start, round(len(src_pages) * page_bytes(dst) * share))


def transfer_kv(src, src_pages: list[int], dst, dst_pages: list[int]) -> TransferResult:
  """Copies the KV in src_pages (source pool) into dst_pages (destination pool); returns once
  the pages have landed."""
  return transfer_kv_async(src, src_pages, dst, dst_pages).result()


def page_bytes(inst) -> int:
  """Bytes of one page of an instance's pool: k and v, every layer and kv head."""
  layers, kvh, _, ps, d = inst.kv_pool_shape
  return 2 * layers * kvh * ps * d * np.dtype(inst.dtype).itemsize


def warm_up_transfers(src, dst) -> None:
  """Runs every transfer bucket once, all its slots filled, with destination ids all out of
  range (nothing written), so first-copy costs between these two sub-meshes fall in warm-up."""
  for b in src.opts.transfer_buckets:
    transfer_kv_async(src, [0] * b, dst, [dst.geom.num_pages] * b).result()


def _destinations(dst, num_shards: int) -> list:
  """The devices of `num_shards` destination shards in `gather_shards`' order."""
  return list(dst.mesh.devices.flat) * (num_shards // dst.tp)


def gather_shards(src, src_pages, dst_tp: int, layers: tuple[int, int] | None = None) -> list:
  """Source half of a transfer, one program: for each filled slot of the pages' plan, the
  single-device arrays that destination devices 0..dst_tp-1 take whole, each
  [2, layers, kv_heads / dst_tp, n, page_size, head_dim] on one source device. Slot-major:
  the plan's p-th piece, destination device j is item p * dst_tp + j. layers: a layer
  group's (its program compiled by `compile_gather(..., layers)`). On an instance that spans
  hosts (multi-controller), an item whose source device is another host's is None here: that
  host holds it (`piece_hosts`)."""
  plan = transfer_plan(src.opts.transfer_buckets, len(src_pages))
  gather, route = (src._gather[(plan.bucket, dst_tp)] if layers is None else
                   src._gather_groups[(plan.bucket, dst_tp, layers)])
  outs = gather(src.kv, plan.ids(src_pages, EMPTY))
  per = len(outs) // len(plan.slots)
  shards = []
  for i in plan.used:
    data = {}
    for split, device in route:
      if split not in data:
        data[split] = {s.device: s.data for s in outs[i * per + split].addressable_shards}
      shards.append(data[split].get(device))
  return shards


def piece_hosts(src_tp: int, src_hosts: int, dst_tp: int, dst_hosts: int) -> list[tuple]:
  """For each destination device j (0..dst_tp-1): (the source host holding its slice, the
  destination host owning j). Hosts own consecutive devices (tp / hosts each), and
  `_piece_plan` puts slice j on source device j * r (r = src_tp / dst_tp) or j // s
  (s = dst_tp / src_tp)."""
  _check_tps(src_tp, dst_tp)
  src_dev = ([j * (src_tp // dst_tp) for j in range(dst_tp)] if src_tp >= dst_tp
             else [j // (dst_tp // src_tp) for j in range(dst_tp)])
  return [(d // (src_tp // src_hosts), j // (dst_tp // dst_hosts))
          for j, d in enumerate(src_dev)]


def shard_shapes(dst, k: int, layers: tuple[int, int] | None = None) -> list[tuple[int, ...]]:
  """The shapes of a k-page transfer's shards as `land_shards` takes them (one per filled
  slot and destination device, in order). layers: a layer group's (None: every layer)."""
  num_layers, kvh, _, ps, d = dst.kv_pool_shape
  if layers is not None:
    num_layers = layers[1] - layers[0]
  plan = transfer_plan(dst.opts.transfer_buckets, k)
  return [(2, num_layers, kvh // dst.tp, n, ps, d) for n in plan.pieces for _ in range(dst.tp)]


def land_shards(dst, shards: list, dst_pages, layers: tuple[int, int] | None = None) -> list:
  """Destination half, one program: assembles each filled slot's piece from its single-device
  arrays (already on dst's devices, in `gather_shards`' order) and scatters every slot into
  dst's pool at dst_pages (ids out of range write nothing). Returns the assembled pieces
  (ready once landed)."""
  plan = transfer_plan(dst.opts.transfer_buckets, len(dst_pages))
  num_layers, kvh, _, ps, d = dst.kv_pool_shape
  if layers is not None:
    num_layers = layers[1] - layers[0]
  sharding, per = NamedSharding(dst.mesh, PAGES_SPEC), dst.tp
  # (on an instance over several hosts, each passes the items on its own devices; the others
  # are None here)
  pieces = [jax.make_array_from_single_device_arrays(
      (2, num_layers, kvh, n, ps, d), sharding,
      [x for x in shards[p * per:(p + 1) * per] if x is not None])
            for p, n in enumerate(plan.pieces)]
  scatter_pieces(dst, dst._scatter if layers is None else dst._scatter_groups[layers], plan,
                 pieces, dst_pages)
  return pieces


def scatter_pieces(dst, scatters: dict, plan: Plan, pieces: list, dst_pages) -> None:
  """Dispatches bucket plan.bucket's scatter program (from `scatters`, `compile_scatter`'s
  outputs by bucket) on dst's pool with the plan's filled slots' pieces, blanks elsewhere."""
  scatter, blanks = scatters[plan.bucket]
  slots = list(blanks)
  for i, piece in zip(plan.used, pieces):
    slots[i] = piece
  ids = plan.ids(dst_pages, dst.geom.num_pages)
  dst.kv = scatter(dst.kv, slots[0] if len(slots) == 1 else tuple(slots), ids)
