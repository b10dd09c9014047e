"""A RemoteInstance (pdjax/distributed/remote.py) over fakes of its actor and of the node KV
stores, no Ray cluster: the driver-side host tier logic under the Ray launcher, with the
order of events that matters to it.

  - A store call runs when it is sent (a store is one actor: calls run in arrival order; the
    driver's `drop`s reach it at once).
  - An instance's step runs when the driver collects it (`ray.get`): its reloads read the
    store then, after whatever the driver sent meanwhile — as a real actor may.
  - The store is the real NodeStore (every page kept in the actor: no object store); the
    instance's offloads go through the real actor's `store_items` (sealed under the run's
    key when it has one) and its step's reloads through `InstanceActor._reload` (retries,
    opening, errors); only the pool's gather and write are faked (a page's bytes are
    `page_bytes(name)`; `scatters` records the writes).

`FakeRay` replaces the `ray` module remote.py uses: `get` evaluates a call, raises Ray's
GetTimeoutError for a call that never returns (a `Wedged` one) when given a timeout, and fails
the test when not (the driver's loop would hang there)."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import ray

from pdjax.distributed.actor import InstanceActor
from pdjax.distributed.node_store import NodeStore
from pdjax.distributed.remote import RemoteInstance


class Call:
  """A call's result, computed once when first asked (ray.get, or awaited by an actor)."""

  def __init__(self, fn):
    self._fn, self._done, self._value = fn, False, None

  def value(self):
    if not self._done:
      self._value, self._done = self._fn(), True
    return self._value

  def __await__(self):
    async def run():
      return self.value()
    return run().__await__()


class Wedged(Call):
  """A call that never returns."""

  def __init__(self):
    super().__init__(None)

  def __await__(self):
    return asyncio.sleep(3600).__await__()


class FakeRay:
  exceptions = ray.exceptions
  ObjectRef = ray.ObjectRef

  def __init__(self):
    self.timeouts: list = []      # each get's timeout

  def get(self, call, timeout=None):
    self.timeouts.append(timeout)
    if isinstance(call, Wedged):
      if timeout is None:
        raise AssertionError("ray.get without a timeout on a call that never returns: the "
                             "driver's loop hangs here")
      raise ray.exceptions.GetTimeoutError("Get timed out: some object(s) not ready.")
    return call.value()

  def wait(self, calls, num_returns=1, timeout=None, fetch_local=True):
    return list(calls), []

  def kill(self, actor, no_restart=True):
    pass


def page_bytes(name: bytes) -> np.ndarray:
  return np.frombuffer(name, np.uint8).astype(np.float32)


class FakeStore:
  """A NodeStore (`store`, its `pages`) called as an actor; `wedged`: its puts never
  return."""

  def __init__(self):
    self.store = NodeStore(large_page_bytes=1 << 62)
    self.pages = self.store.pages
    self.wedged = False
    for method in ("put", "get", "drop", "tamper_sealed_reads"):
      fn = getattr(self.store, method)
      setattr(self, method, types.SimpleNamespace(
          remote=lambda *a, fn=fn, **k: self._sent(fn, a, k)))

  def _sent(self, fn, args, kwargs):
    if fn == self.store.put and self.wedged:
      return Wedged()
    value = fn(*args, **kwargs)   # (run now: in arrival order)
    return Call(lambda: value)


class FakeActor:
  """An instance's process on `node`: offload copies pool pages (`page_bytes(name)`) to a
  store, sealed when given the run's key; a step reloads its pages through
  InstanceActor._reload when collected."""

  def __init__(self, node: int = 0):
    self.scatters: list[tuple[list[int], list]] = []   # (pages, arrays) written into the pool
    actor = InstanceActor.__new__(InstanceActor)
    actor.node, actor._sealer = node, None
    actor._copies = types.SimpleNamespace(
        scatter_from_host=lambda pages, arrays: self.scatters.append((pages, arrays)))
    self.actor = actor
    self.offload = types.SimpleNamespace(remote=self._offload)
    self.step = types.SimpleNamespace(remote=self._step)

  def _offload(self, pages, names, store, seal_key=None):
    return store.put.remote(self.actor.store_items(names, [page_bytes(n) for n in names],
                                                   seal_key))

  def _step(self, seq, kind, seqs, prev_seq, revoked, loads=(), store=None, remote_loads=(),
            stores=None, seal_key=None, **_):
    async def run():
      if loads or remote_loads:
        await self.actor._reload(list(loads), store, list(remote_loads), stores, seal_key)
      return {"tokens": [], "build_s": 0.0, "dispatch_s": 0.0, "reload_s": 0.0,
              "compiles": 0, "compiles_from_cache": 0, "lazy_compiles": 0,
              "lazy_compile_s": 0.0}
    return Call(lambda: asyncio.run(run()))


def remote_instance(tier, stores: dict, node: int = 0, name: str = "colocated-0",
                    num_pages: int = 16, page_size: int = 4,
                    seal_key: bytes | None = None) -> RemoteInstance:
  """A live RemoteInstance on `node` with a prefix cache, sharing `tier` (its node's), its
  store stores[node]; seal_key: the run's (its store's pages sealed)."""
  spec = types.SimpleNamespace(name=name, role="colocated", tp=1, node=node,
                               opts=types.SimpleNamespace(num_pages=num_pages,
                                                          page_size=page_size))
  inst = RemoteInstance(spec, None, {})
  inst.actor, inst.alive, inst.store_of, inst._seq = FakeActor(node), True, stores.__getitem__, 0
  inst.seal_key = seal_key
  inst.tables.enable_prefix_cache()
  inst.attach_host_tier(tier)
  return inst
