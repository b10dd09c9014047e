"""One serving instance in its own process: the body of a Ray actor (`launcher` wraps it).

The actor owns the devices its process sees (CPU: its own virtual devices; GPU/TPU: the chips
Ray assigned), builds an `engine.Instance` on them with the run's parameters (seeded, or read
from the checkpoint folder by this process), and runs a `jax.experimental.transfer` server for
KV. The driver's `RemoteInstance` calls it; the host-side block tables stay in the driver, so
steps and transfers carry page ids only.

Every method is a coroutine on the actor's one event loop, so device work is dispatched in a
single thread: a method's dispatch (a step, a gather, a scatter into the pool) runs without an
`await` in between, and steps are dispatched in their sequence order whatever order Ray starts
the calls in (`_in_order`). Waiting (a step's readback, a pull in flight) happens off the loop
or between polls, so the next step is dispatched while the previous one runs (overlap).

Transfers: `offer` gathers a request's pages into destination-shaped single-device pieces
with one program (`engine.transfer.gather_shards`, resharded for the puller's TP) and puts them
on the transfer server under a uuid; `pull` fetches them all by that uuid from the source's
server in one pull, waits (polling, with a deadline) until every piece has arrived, then
scatters them into this pool with one program (`land_shards`). The driver sends both calls at
once (neither waits for the other: the pull waits on the transfer server for the offer). A piece that never arrives raises DeviceError at the deadline and nothing is
written; a piece that arrives broken (its source died) raises DeviceError before the scatter,
so the pool is never poisoned. The driver's deadline runs from the offer's dispatch, the
pull's from when the actor starts it: a pull may still be waiting after the driver gave up on
it and gave its pages to another request. Each pull carries its destination allocation's
epoch and the driver names the epochs it gave up on in every later step and pull it sends
here; a pull whose epoch was given up is dropped before it scatters. An offer whose pull
never ran (its destination died, or dropped it as late) expires when no pull of it can still
be wanted (`ttl_s`: the pull deadline plus the driver's grace): the source takes it back from
its own server, so its pieces do not stay there forever. The driver `settle`s the offers
whose pull ran (taken, or to be taken by that pull), which never expire.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import jax
from jax.experimental import transfer as jax_transfer
from jax.sharding import SingleDeviceSharding

from pdjax.engine import mesh as mesh_lib
from pdjax.engine import transfer
from pdjax.engine.cluster import enable_compile_cache, host_params
from pdjax.engine.instance import Instance
from pdjax.engine.options import EngineOptions
from pdjax.distributed.host_transfer import HostTransferMixin
from pdjax.distributed.node_store import STORE_TIMEOUT_S, fetch_pages
from pdjax.distributed.sealed_kv import SealedActorMixin, open_each, sealer_of
from pdjax.engine.runtime import device_errors
from pdjax.kv.remote_store import RemotePagesUnread
from pdjax.models.llama_config import LlamaConfig
from pdjax.errors import (DeviceError, HostTierLost, PullNotStarted, RemoteStoreLost,
                                    StepNotRun)

PULL_POLL_S = 0.0005   # how often a pull in flight is checked



@dataclasses.dataclass(frozen=True)
class ActorSpec:
  """What an instance's process needs to build it (picklable; no arrays)."""
  name: str
  role: str
  tp: int
  model: LlamaConfig
  opts: EngineOptions
  checkpoint: str = ""            # model.checkpoint ("" = seeded random weights)
  seed: int = 0
  compile_cache_dir: str = ""
  transfer_host: str = "127.0.0.1"   # the address the transfer server listens on; "node":
                                     # the actor's node address (hosts that reach each other)
  node: int = 0                      # the run's node it is placed on (cluster.nodes)


def _ray_node_id() -> str:
  import ray
  return ray.get_runtime_context().get_node_id()


class InstanceActor(SealedActorMixin, HostTransferMixin):

  def __init__(self, spec: ActorSpec):
    enable_compile_cache(spec.compile_cache_dir)
    devices = jax.devices()
    if len(devices) < spec.tp:
      raise ValueError(f"{spec.name} needs {spec.tp} devices, its process sees {len(devices)}")
    params = host_params(spec.model, checkpoint=spec.checkpoint, seed=spec.seed,
                         dtype=spec.opts.dtype)
    self.inst = Instance(mesh_lib.InstanceSpec(spec.name, spec.role, tuple(devices[:spec.tp])),
                         spec.model, params, spec.opts)
    host = spec.transfer_host
    if host == "node":           # this actor's own node address as Ray knows it (multi-host)
      import ray
      host = ray.util.get_node_ip_address()
    self.server = jax_transfer.start_transfer_server(devices[0].client, f"{host}:0",
                                                     [f"{host}:0"])
    self._connections: dict[str, object] = {}
    self._revoked: set[int] = set()   # epochs of pulls the driver gave up on (never land)
    self._offers: dict[int, list] = {}   # uuid -> its pieces' avals, until settled or expired
    self._split_offers: dict[int, list] = {}   # uuid -> its per-host offers' ids (hosts > 1)
    self._self_connection = None
    self.offers_expired = 0
    self._next_seq = 0              # the sequence number of the next step to dispatch
    self._turn: asyncio.Condition | None = None
    self._last: tuple[int, object] | None = None   # (seq, PendingTokens) last dispatched
    self._copies = None             # HostCopies, once the node's KV store is used
    self.node = spec.node
    self._sealer = None             # its PageSealer for the run key (sealed_kv.sealer_of)

  async def describe(self) -> dict:
    return {"address": self.server.address(), "pid": os.getpid(),
            "platform": self.inst.mesh.devices.flat[0].platform,
            "overlap_by_default": self.inst.overlap_by_default,
            "page_bytes": transfer.page_bytes(self.inst), "ray_node_id": _ray_node_id(),
            **self._counters()}

  def _counters(self) -> dict:
    i = self.inst
    return {"compiles": i.compiles, "compiles_from_cache": i.compiles_from_cache,
            "lazy_compiles": i.lazy_compiles, "lazy_compile_s": i.lazy_compile_s}

  async def warm_up(self, prefill: bool, decode: bool, transfer_to_tp: tuple[int, ...],
                    receive: bool) -> dict:
    self.inst.warm_up(prefill=prefill, decode=decode, transfer_to_tp=transfer_to_tp,
                      receive=receive)
    return self._counters()

  # ---- steps -------------------------------------------------------------------------------

  async def _in_order(self, seq: int) -> None:
    if self._turn is None:
      self._turn = asyncio.Condition()
    async with self._turn:
      await self._turn.wait_for(lambda: self._next_seq == seq)

  async def _advance(self) -> None:
    async with self._turn:
      self._next_seq += 1
      self._turn.notify_all()

  # ---- the node's KV store (the host tier's bytes: node_store.py) --------------------------

  def _host_copies(self):
    if self._copies is None:
      from pdjax.engine.host_copies import HostCopies
      self._copies = HostCopies(self.inst)
    return self._copies

  async def offload(self, pages: list[int], names: list[bytes], store,
                    seal_key: bytes | None = None) -> int:
    """Copies these pool pages to the node's KV store under their names (device -> this
    process's host memory -> the store), each sealed under its name first when seal_key is
    set (the store then holds no plaintext: `store_items`); returns their bytes once the
    store has them."""
    import ray
    items = self.store_items(names, self._host_copies().gather_to_host(pages), seal_key)
    try:
      return await store.put.remote(items)
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
      raise HostTierLost(f"the node KV store is gone: {type(e).__name__}") from None

  async def _reload(self, loads: list, store, remote_loads: list = (), stores=None,
                    seal_key: bytes | None = None) -> None:
    """Writes host pages from the stores into the pool (before the step that reads them):
    loads [(page, name)] from this node's store, remote_loads [(page, name, node)] from
    stores[node] (another node's). When seal_key is set the stores hold sealed pages, opened
    here (`_read_sealed`). A store that is gone, or does not answer within STORE_TIMEOUT_S,
    fails the step with HostTierLost (this node's) or RemoteStoreLost (another's): that tier
    is lost."""
    reads = []                       # (node, its store, [(page, name)], lost)
    if loads:
      reads.append((self.node, store, list(loads), HostTierLost("the node KV store is gone")))
    for node in sorted({n for _, _, n in remote_loads}):
      reads.append((node, stores[node], [(p, x) for p, x, n in remote_loads if n == node],
                    RemoteStoreLost(f"the KV store of node {node} is gone", node)))
    pages, arrays = [], []
    for node, from_store, these, lost in reads:
      names = [name for _, name in these]
      if seal_key is None:
        arrays += await _from_store(from_store.get.remote(names), lost)
      else:
        arrays += await _read_sealed(from_store, node, names, sealer_of(self, seal_key), lost)
      pages += [page for page, _ in these]
    self._host_copies().scatter_from_host(pages, arrays)

  async def step(self, seq: int, kind: str, seqs: list, prev_seq: int | None,
                 revoked: tuple[int, ...] = (), offers: tuple = (),
                 offer_ttl_s: float = 0.0, loads: tuple = (), store=None,
                 remote_loads: tuple = (), stores=None, seal_key: bytes | None = None) -> dict:
    """Dispatches step `seq` (after every earlier one), waits for its tokens off the event loop
    and returns them with its host timings and the compile counters. prev_seq: the step whose
    device tokens feed PendingToken rows (the one dispatched just before). When that step
    failed at dispatch (DeviceError), this one is not launched and raises StepNotRun: with
    overlap the driver dispatches a step before it can know the one before it failed.
    revoked: pulls the driver gave up on (see `pull`). offers (a prefill streaming KV by layer
    groups, kv.stream_layers): [(one uuid per layer group, source pages, puller's TP)]: each
    group's pages are offered under its uuid as soon as the group is enqueued (`OfferStream`),
    each expiring after offer_ttl_s unless settled, as `offer`'s. loads: [(page, name)] host
    pages the step reads, fetched from the node's KV store and written into the pool first;
    remote_loads [(page, name, node)]: those from other nodes' stores (`_reload`)."""
    self._revoked.update(revoked)   # before any await: no late pull lands after this step
    reload_s = 0.0                  # fetching and writing `loads` (host_stats load_s)
    await self._in_order(seq)
    try:
      prev = None
      if prev_seq is not None:
        if self._last is None or self._last[0] != prev_seq:
          raise ValueError(f"step {seq} takes tokens of step {prev_seq}, the last dispatched "
                           f"is {self._last and self._last[0]}")
        prev = self._last[1]
        if prev is None:           # its input tokens were never computed: not launched
          self._last = (seq, None)
          raise StepNotRun(f"step {seq} was not run: step {prev_seq}, whose tokens it takes, "
                           f"failed")
      launch = self.inst.prefill if kind == "prefill" else self.inst.decode
      if offers:
        streams = [OfferStream(self, tuple(uuids), pages, dst_tp, offer_ttl_s)
                   for uuids, pages, dst_tp in offers]
        launch = lambda seqs, prev: self.inst.prefill(seqs, prev, streams=streams)  # noqa: E731
      try:
        if loads or remote_loads:
          t0 = time.perf_counter()
          await self._reload(list(loads), store, list(remote_loads), stores, seal_key)
          reload_s = time.perf_counter() - t0
        pending = launch(seqs, prev)
      except DeviceError:
        self._last = (seq, None)   # a step dispatched ahead on its tokens is not run either
        raise
      self._last = (seq, pending)
    finally:
      await self._advance()
    tokens = await asyncio.get_running_loop().run_in_executor(None, pending.result)
    return {"tokens": tokens, "build_s": pending.build_s, "dispatch_s": pending.dispatch_s,
            "reload_s": reload_s, **self._counters()}

  # ---- KV transfer -------------------------------------------------------------------------

  async def offer(self, uuid: int, pages: list[int], dst_tp: int, ttl_s: float,
                  layers: tuple[int, int] | None = None, dst_hosts: int = 1) -> int:
    """Gathers the pages with one program into pieces shaped for a TP-dst_tp puller
    (`engine.transfer.gather_shards`) and offers them under uuid; returns their bytes. The
    pool's pages may be freed once the pull is acknowledged: the pieces are copies. An offer
    the driver has not `settle`d within ttl_s (its pull never ran: the destination died, or
    dropped it as late) expires: this actor pulls it from its own server and drops it,
    freeing the pieces (jax's own await_pull timeout is not used: in jax 0.10.2 an expired
    entry made later, valid pulls on the same server hang). layers=(a, b): those layers only
    (a layer group's, pulled with the same `layers`). dst_hosts, or this instance's own hosts,
    > 1: the items are offered per destination host (host_transfer.py); returns this host's
    bytes."""
    with device_errors():
      shards = transfer.gather_shards(self.inst, pages, dst_tp,
                                      None if layers is None else tuple(layers))
      if dst_hosts == 1 and self.hosts == 1:
        self._offered(uuid, shards, ttl_s)
      else:
        self._offer_by_host(uuid, shards, dst_tp, dst_hosts, ttl_s)
    return sum(int(s.nbytes) for s in shards if s is not None)

  def _offered(self, uuid: int, shards: list, ttl_s: float) -> None:
    """Puts the pieces on the transfer server under uuid; they expire after ttl_s unless
    settled (see `offer`)."""
    self.server.await_pull(uuid, shards)
    self._offers[uuid] = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=s.sharding)
                          for s in shards]
    asyncio.get_running_loop().call_later(ttl_s, self._expire, uuid)

  async def settle(self, uuids: list[int]) -> None:
    """The driver saw these offers' pulls run: they are taken (or will be), never expire."""
    for uuid in uuids:
      self._offers.pop(uuid, None)
      self._settle_split(uuid)

  def _expire(self, uuid: int) -> None:
    """Takes an unsettled offer back: a pull from this actor's own server whose result is
    dropped at once (measured: the pieces' memory is freed once it lands). Should a late pull
    have taken the offer after all, this pull waits forever, which costs no memory (100
    such 4 MB pulls left the process's RSS unchanged) and delays no other pull."""
    avals = self._offers.pop(uuid, None)
    if avals is None:
      return
    if self._self_connection is None:
      self._self_connection = self.server.connect(self.server.address())
    with device_errors():
      self._self_connection.pull(uuid, avals)
    self.offers_expired += 1

  async def offer_counts(self) -> dict:
    """{"held": offers neither settled nor expired, "expired": offers expired so far}."""
    return {"held": len(self._offers), "expired": self.offers_expired}

  async def pull(self, uuid: int, address: str, pages: list[int], timeout_s: float,
                 epoch: int = 0, revoked: tuple[int, ...] = (),
                 layers: tuple[int, int] | None = None, sources: tuple | None = None) -> dict:
    """Pulls offer `uuid` from the transfer server at `address` into this pool's pages (as
    many as the offer's) with one pull of all its pieces and returns {"bytes", "seconds"} once
    every piece is here and the one scatter program is dispatched (later steps on this pool
    see the pages). Raises
    DeviceError when the pieces are not all here within timeout_s, or arrive broken.
    epoch: this destination allocation's number (RemoteInstance). The driver gives up on a
    pull on its own clock and then reuses its pages; every later step or pull it sends here
    names the pulls it gave up on (`revoked`), so a pull checks its epoch before scattering:
    a late one is dropped (DeviceError), never landed into pages another request now owns.
    layers=(a, b): the offer holds those layers only (one layer group of a streamed prefill:
    `step`'s offers), landed into those layers of the pages. sources (either instance spans
    hosts): (source tp, source hosts, each source host's address), the items pulled per host
    (host_transfer.py)."""
    start = time.perf_counter()
    self._revoked.update(revoked)
    layers = None if layers is None else tuple(layers)
    try:
      arrays = await self._fetch(uuid, address, pages, timeout_s, epoch, start, layers, sources)
      return self._land(arrays, address, pages, epoch, start, layers)
    finally:
      self._revoked.discard(epoch)

  def _check_epoch(self, epoch: int, address: str, error=DeviceError) -> None:
    if epoch in self._revoked:
      raise error(f"KV pull from {address} dropped: the driver gave up on it (epoch "
                  f"{epoch}) and its pages may belong to another request")

  async def _fetch(self, uuid: int, address: str, pages: list[int], timeout_s: float,
                   epoch: int, start: float, layers: tuple[int, int] | None,
                   sources: tuple | None = None) -> list:
    """The pull's pieces on this host's devices, every one arrived whole (None for the items
    of other hosts of this instance); DeviceError when they are not within timeout_s."""
    self._check_epoch(epoch, address, PullNotStarted)   # the offer is left to expire
    inst = self.inst
    devices = list(inst.mesh.devices.flat)
    avals = [jax.ShapeDtypeStruct(shape, inst.dtype, sharding=SingleDeviceSharding(d))
             for shape, d in zip(transfer.shard_shapes(inst, len(pages), layers),
                                 devices * len(pages))]
    with device_errors():
      if sources is not None:
        arrays = self._pull_by_host(uuid, avals, sources)
      else:
        if address not in self._connections:
          self._connections[address] = self.server.connect(address)
        arrays = self._connections[address].pull(uuid, avals)
    mine = [a for a in arrays if a is not None]
    while not all(a.is_ready() for a in mine):
      if time.perf_counter() - start > timeout_s:
        raise DeviceError(f"KV pull from {address} not complete after {timeout_s:g} s")
      await asyncio.sleep(PULL_POLL_S)
      self._check_epoch(epoch, address)
    with device_errors():
      for a in mine:
        a.block_until_ready()   # a piece whose source died raises here, before the scatter
    return arrays

  def _land(self, arrays: list, address: str, pages: list[int], epoch: int, start: float,
            layers: tuple[int, int] | None) -> dict:
    """Writes fetched pieces into the pool with one program (unless the driver gave up on
    this epoch: DeviceError, nothing written)."""
    with device_errors():
      self._check_epoch(epoch, address)   # no await from here to the scatter's dispatch
      transfer.land_shards(self.inst, arrays, pages, layers)
    return {"bytes": sum(int(a.nbytes) for a in arrays if a is not None),
            "seconds": time.perf_counter() - start}


async def _from_store(call, lost: Exception) -> list:
  """A store call's pages (large pages' objects fetched); `lost` (its message, with why) when
  the store is gone or does not answer within STORE_TIMEOUT_S."""
  import ray
  try:
    return await fetch_pages(await asyncio.wait_for(call, STORE_TIMEOUT_S))
  except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
          asyncio.TimeoutError) as e:
    raise type(lost)(f"{lost}: {type(e).__name__}", *lost.args[1:]) from None


async def _read_sealed(store, node: int, names: list[bytes], opener, lost) -> list:
  """Node `node`'s pages (this one's or another's), sealed by their writer, opened here. A
  read whose pages do not all open is read once more (a piece corrupted on its way); when
  some fail again, the reload fails with RemotePagesUnread naming them (that node's tier
  forgets them, and nothing else)."""
  for _ in range(2):
    pieces = await _from_store(store.get.remote(names), lost)
    arrays, bad = open_each(opener, names, pieces)
    if not bad:
      return arrays
  raise RemotePagesUnread(f"node {node}'s KV store served pages that did not open, twice: "
                          f"{bad[0][1]}", node, [n for n, _ in bad])


class OfferStream:
  """A stream of a prefill run by layer groups (engine/layer_groups.py) whose decode instance
  is another actor: as each group is enqueued its pages' slice for those layers is gathered
  (one program, pieces shaped for the puller's TP) and offered under that group's uuid; the
  puller pulls each group once (`pull(..., layers=)`). sent(): the uuids offered."""

  def __init__(self, actor: InstanceActor, uuids: tuple[int, ...], pages: list[int],
               dst_tp: int, ttl_s: float):
    self.actor, self.uuids, self.pages, self.dst_tp, self.ttl_s = actor, uuids, pages, dst_tp, ttl_s
    self._next = 0

  def send(self, inst, layers: tuple[int, int]) -> int:
    uuid, self._next = self.uuids[self._next], self._next + 1
    self.actor._offered(uuid, transfer.gather_shards(inst, self.pages, self.dst_tp, layers),
                        self.ttl_s)
    return uuid

  def sent(self, groups: list) -> list:
    return groups
