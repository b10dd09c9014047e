"""A RemoteInstance (pdjax/distributed/remote.py) over fakes of its actor and of the node KV
stores, no Ray cluster: the driver-side host tier logic under the Ray launcher, with the
order of events that matters to it.

  - A store call runs when it is sent (a store is one actor: calls run in arrival order; the
    driver's `drop`s reach it at once).
  - An instance's step runs when the driver collects it (`ray.get`): its reloads read the
    store then, after whatever the driver sent meanwhile — as a real actor may.
  - The step's reloads go through the real actor's `InstanceActor._reload` (retries, sealing,
    errors); only the pool write is faked (`scatters` records it).

`FakeRay` replaces the `ray` module remote.py uses: `get` evaluates a call, raises Ray's
GetTimeoutError for a call that never returns (a `Wedged` one) when given a timeout, and fails
the test when not (the driver's loop would hang there)."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import ray

from pdjax.distributed.actor import InstanceActor
from pdjax.distributed.remote import RemoteInstance
from pdjax.distributed.sealed_kv import seal_pages


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
  """NodeStore's calls; `wedged`: its puts never return; `tamper_reads`: that many sealed
  reads hand out a piece with one byte flipped."""

  def __init__(self):
    self.pages: dict[bytes, np.ndarray] = {}
    self.wedged, self.tamper_reads = False, 0
    for method in ("put", "get", "get_sealed", "drop"):
      fn = getattr(self, "_" + method)
      setattr(self, method, types.SimpleNamespace(
          remote=lambda *a, fn=fn, **k: self._sent(fn, a, k)))

  def _sent(self, fn, args, kwargs):
    if fn == self._put and self.wedged:
      return Wedged()
    value = fn(*args, **kwargs)   # (run now: in arrival order)
    return Call(lambda: value)

  def _put(self, items):
    self.pages.update(items)
    return sum(int(a.nbytes) for a in items.values())

  def _get(self, names):
    return [self.pages[n] for n in names]

  def _get_sealed(self, names, key):
    tamper, self.tamper_reads = self.tamper_reads > 0, max(self.tamper_reads - 1, 0)
    return seal_pages(key, names, [self.pages[n] for n in names], tamper)

  def _drop(self, names):
    return sum(self.pages.pop(n, None) is not None for n in names)


class FakeActor:
  """An instance's process: offload copies pool pages (named `page_bytes(name)`) to a store;
  a step reloads its pages through InstanceActor._reload when collected."""

  def __init__(self):
    self.scatters: list[tuple[list[int], list]] = []   # (pages, arrays) written into the pool
    actor = InstanceActor.__new__(InstanceActor)
    actor._copies = types.SimpleNamespace(
        scatter_from_host=lambda pages, arrays: self.scatters.append((pages, arrays)))
    self.actor = actor
    self.offload = types.SimpleNamespace(remote=self._offload)
    self.step = types.SimpleNamespace(remote=self._step)

  def _offload(self, pages, names, store):
    return store.put.remote({n: page_bytes(n) for n in names})

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
                    num_pages: int = 16, page_size: int = 4) -> RemoteInstance:
  """A live RemoteInstance on `node` with a prefix cache, sharing `tier` (its node's), its
  store stores[node]."""
  spec = types.SimpleNamespace(name=name, role="colocated", tp=1, node=node,
                               opts=types.SimpleNamespace(num_pages=num_pages,
                                                          page_size=page_size))
  inst = RemoteInstance(spec, None, {})
  inst.actor, inst.alive, inst.store_of, inst._seq = FakeActor(), True, stores.__getitem__, 0
  inst.tables.enable_prefix_cache()
  inst.attach_host_tier(tier)
  return inst
