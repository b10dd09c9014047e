"""The real engine's side of the host KV tier (pdjax/kv/host_tier.py): a prefix page evicted
from an instance's pool is gathered on its devices and copied to host memory asynchronously
(`copy_to_host_async`: the step loop never waits); pages a request reloads are written back
into the pool by one scatter program per chunk of up to pages_per_seq pages (a transfer's
bucket program, `engine.transfer.scatter_pieces`), dispatched before the step that reads them
(JAX runs a device's programs in dispatch order, so the step sees them).

A page's host copy is readable as soon as it is offered: a reload before the copy reached the
host reads the same bytes, by data dependency, so the tier's `ready_s` is the offer time. The
device buffer of a copy is let go once its host copy is materialized (at the next offload or at
its reload), so the tier holds host memory, not HBM.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import NamedSharding

from pdjax.engine import programs
from pdjax.engine.runtime import device_errors
from pdjax.engine.transfer import PAGES_SPEC, compile_scatter, scatter_pieces, transfer_plan


class HostKV:
  """One page's K/V, [2, layers, kv_heads, page_size, head_dim]: on its way to host memory,
  then there."""

  def __init__(self, on_device):
    self._device, self._host = on_device, None
    on_device.copy_to_host_async()

  def landed(self) -> bool:
    return self._host is not None or self._device.is_ready()

  def host(self) -> np.ndarray:
    if self._host is None:
      with device_errors():
        self._host = np.asarray(self._device)[:, :, :, 0]
      self._device = None
    return self._host


class HostCopies:
  """Offloads and reloads for one engine Instance (attached by Instance.attach_host_tier)."""

  def __init__(self, inst, compiled=None):
    """compiled: `compiled_programs` of an earlier HostCopies of inst (kept by a reset
    instance)."""
    self.inst = inst
    if compiled is None:
      gather = inst._compile(programs.gather_pages, (inst.kv, np.zeros(1, np.int32)),
                             (inst._kv_sh, inst._rep), NamedSharding(inst.mesh, PAGES_SPEC))
      scatter = {}
      for n in inst.opts.transfer_buckets:   # blanks shared with the instance's own scatters
        scatter[n] = compile_scatter(inst, n, _blanks(inst, scatter))
      compiled = (gather, scatter)
    self._gather, self._scatter = compiled
    self._in_flight: list[HostKV] = []
    self.stats = {"offload_pages": 0, "load_pages": 0, "load_s": 0.0}

  @property
  def compiled_programs(self) -> tuple:
    """(gather program, {bucket: scatter program}): what a later HostCopies may reuse."""
    return self._gather, self._scatter

  def offload(self, page: int, name: bytes, salt: str) -> None:
    """The prefix cache's on_drop: page is about to be reused; its bytes go to the tier."""
    still = []
    for c in self._in_flight:     # copies that reached the host let their device buffer go
      if c.landed():
        c.host()
      else:
        still.append(c)
    self._in_flight = still
    with device_errors():
      copy = HostKV(self._gather(self.inst.kv, np.array([page], np.int32)))
    self._in_flight.append(copy)
    if self.inst.tables.host.offer(name, salt, salt, copy, writer=self.inst.name,
                                   ready_s=0.0, now=0.0):
      self.stats["offload_pages"] += 1

  def land(self) -> None:
    """Writes the pages reloaded since the last step into the pool (before that step)."""
    loads = self.inst.tables.take_loads() if self.inst.tables.pending_loads else ()
    if loads:
      self.scatter_from_host([p for p, _ in loads], [kv.host() for _, kv in loads])

  def gather_to_host(self, pages: list[int]) -> list[np.ndarray]:
    """These pool pages' K/V in host memory now, one [2, L, KVH, ps, D] array each (a node
    store's offload, under the Ray launcher: distributed/node_store.py)."""
    with device_errors():   # (the gather program is compiled for one page)
      copies = [HostKV(self._gather(self.inst.kv, np.array([p], np.int32))) for p in pages]
      out = [np.ascontiguousarray(c.host()) for c in copies]
    self.stats["offload_pages"] += len(pages)
    return out

  def scatter_from_host(self, pages: list[int], arrays: list[np.ndarray]) -> None:
    """Writes host copies of pages into the pool at `pages`, dispatched before the next
    step (which then reads them)."""
    t0 = time.perf_counter()
    inst, sharding = self.inst, NamedSharding(self.inst.mesh, PAGES_SPEC)
    ids_all = np.array(pages, np.int32)
    data = np.stack(arrays, axis=3)   # [2, L, KVH, n, ps, D]
    largest = inst.opts.transfer_buckets[-1]
    with device_errors():
      for start in range(0, len(pages), largest):
        ids = ids_all[start:start + largest]
        plan = transfer_plan(inst.opts.transfer_buckets, len(ids))
        bounds = np.cumsum([start] + plan.pieces)
        pieces = jax.device_put([data[:, :, :, a:b] for a, b in zip(bounds, bounds[1:])],
                                sharding)
        scatter_pieces(inst, self._scatter, plan, pieces, ids)
    self.stats["load_pages"] += len(pages)
    # Host seconds to stage and dispatch the copies (the device side runs ahead of the step
    # in its queue; the engine does not wait for it here).
    self.stats["load_s"] += time.perf_counter() - t0


def _blanks(inst, *scatters: dict) -> dict:
  """The blanks (by size) of the scatter programs already compiled for inst."""
  return {x.shape[3]: x for found in (inst._scatter,) + scatters
          for _, blanks in found.values() for x in blanks if x is not None}


class HostHandoff:
  """A P -> D hand-off through the host tier in flight (kv.host_tier_handoff=host): the
  prompt's named pages are on their way to host memory (and stay in the tier), the rest moves
  device to device; ready once all of it arrived; result() queues the host pages as the
  destination's reloads, written into its pool before its next step."""

  def __init__(self, dst, copies: list[tuple[int, HostKV]], direct, num_bytes: int):
    self.dst, self.copies, self.direct, self.num_bytes = dst, copies, direct, num_bytes
    self.start, self._seconds = time.perf_counter(), None

  def ready(self) -> bool:
    if self._seconds is None and all(c.landed() for _, c in self.copies) and (
        self.direct is None or self.direct.ready()):
      self._seconds = time.perf_counter() - self.start
    return self._seconds is not None

  def result(self):
    from pdjax.kv.transfer_result import TransferResult
    if self.direct is not None:
      self.direct.result()
    for page, copy in self.copies:
      copy.host()
      self.dst.tables.pending_loads[page] = copy
    if self._seconds is None:
      self._seconds = time.perf_counter() - self.start
    return TransferResult(bytes=self.num_bytes, seconds=self._seconds)


def transfer_through_host_tier(src, src_pages: list[int], dst, dst_pages: list[int]):
  """The run's transfer_fn under kv.host_tier_handoff=host: src's named (full prompt) pages
  are written through the node's host tier — offered to it, so any instance can reload them
  later — and read back by dst; the unnamed rest (the partial last page) by the device
  transfer. An instance without a host tier transfers device to device."""
  from pdjax.engine.transfer import page_bytes, transfer_kv_async
  if src.host_copies is None:
    return transfer_kv_async(src, src_pages, dst, dst_pages)
  if len(src_pages) != len(dst_pages):
    raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} destination")
  cache, tier = src.tables.cache, src.tables.host
  copies, rest = [], []
  for s, d in zip(src_pages, dst_pages):
    entry = cache.name_of(s)
    if entry is None:
      rest.append((s, d))
      continue
    with device_errors():
      copy = HostKV(src.host_copies._gather(src.kv, np.array([s], np.int32)))
    copies.append((d, copy))
    if tier.offer(entry[0], entry[1], entry[1], copy, writer=src.name, ready_s=0.0, now=0.0):
      src.host_copies.stats["offload_pages"] += 1
  direct = (transfer_kv_async(src, [s for s, _ in rest], dst, [d for _, d in rest])
            if rest else None)
  return HostHandoff(dst, copies, direct, len(src_pages) * page_bytes(dst))
