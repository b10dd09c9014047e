"""The driver's side of an instance that lives in a Ray actor: the same interface as
`engine.Instance` (name, role, opts, host-side block tables, prefill/decode returning a pending
step), so the driver and the policies do not change.

A step is one actor call; its pending object is the call's Ray future: `ready()` asks Ray
without blocking (`ray.wait(timeout=0)`), `result()` fetches the tokens. Steps carry a
per-actor sequence number (the actor dispatches them in that order) and, when dispatched ahead,
the sequence number of the step whose device tokens they read.

Failures, as the driver expects them: a DeviceError raised in the actor arrives as DeviceError;
the actor's process gone (killed, crashed) arrives as `InstanceLost`; any other exception in
the actor is a bug and propagates as Ray raised it. The driver waits for the node KV store
(flush_offloads) at most `store_timeout_s`: a store that does not answer is lost, as a dead one.

Host pages a step reloads stay pinned in their tiers (HostTier.pin) until the step's result
is in, or the instance is killed: the actor reads them from the store when the step runs, after
the driver may have planned more (whose offloads could otherwise evict them). Under
kv.seal_cross_node the run's `seal_key` goes with every offload and step: the actor seals what
it writes to a store and opens what it reads from one (sealed_kv.py).

The transfer function of a Ray run (`RayTransfer`, actor to actor) is in ray_transfer.py;
RemoteInstance keeps its destination side's pull epochs.
"""

from __future__ import annotations

import itertools

import ray

from pdjax.cli import first_and_last_line
from pdjax.distributed.node_store import STORE_TIMEOUT_S
from pdjax.kv.pages import BlockTables
from pdjax.kv.remote_store import RemotePage, RemotePagesUnread
from pdjax.errors import DeviceError, HostTierLost, InstanceLost, RemoteStoreLost


def ray_result(ref, name: str, timeout_s: float | None = None):
  """ray.get, with the actor's expected failures as the driver's exceptions (GetTimeoutError
  after timeout_s, when given)."""
  try:
    return ray.get(ref, timeout=timeout_s)
  except ray.exceptions.RayActorError as e:
    raise InstanceLost(f"{name}'s process is gone: {first_and_last_line(str(e))}") from e
  except ray.exceptions.RayTaskError as e:
    if isinstance(e.cause, DeviceError):   # (its kind kept: StepNotRun is planned again)
      raise type(e.cause)(*e.cause.args) from e
    raise


def is_ready(ref) -> bool:
  return bool(ray.wait([ref], timeout=0, fetch_local=False)[0])


def wait_any(pendings, timeout_s: float) -> None:
  """Blocks until one of the pending objects' calls has returned, or timeout_s (the driver's
  `_block`: every pending class here offers this same function)."""
  refs = [r for p in pendings for r in p.refs_to_wait()]
  if refs:
    ray.wait(refs, num_returns=1, timeout=timeout_s, fetch_local=False)


class RemotePending:
  """A step dispatched on an actor. build_s / dispatch_s: the actor's host seconds building
  and launching it (known once the result is in)."""

  def __init__(self, ref, seq: int, instance: "RemoteInstance"):
    self.ref, self.seq, self._instance = ref, seq, instance
    self.build_s = self.dispatch_s = 0.0

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [self.ref]

  def ready(self) -> bool:
    return is_ready(self.ref)

  def result(self) -> list[int]:
    try:
      out = ray_result(self.ref, self._instance.name)
    except HostTierLost:
      self._instance.lose_host_tier()
      raise
    except RemoteStoreLost as e:     # (another node's store: its tier, for every instance)
      for tier in self._tiers(e.node):
        tier.lose()
      raise
    except RemotePagesUnread as e:   # (sealed pages of a node's that did not open: forgotten)
      for tier in self._tiers(e.node):
        tier.discard(e.names)
      raise
    finally:
      self._instance.reads_done(self.seq)   # (the step has read its host pages, or never will)
    self.build_s, self.dispatch_s = out["build_s"], out["dispatch_s"]
    self._instance.host_stats["load_s"] += out["reload_s"]
    self._instance.counters = {k: out[k] for k in COUNTERS}
    return out["tokens"]

  def _tiers(self, node: int) -> list:
    """The live tier of `node` this instance reads: its own node's, or another's."""
    host, remote = self._instance.tables.host, self._instance.tables.remote
    tiers = [host] if host is not None and host.node == node else [
        t for t in (remote.peers if remote is not None else ()) if t.node == node]
    return [t for t in tiers if not t.lost]


COUNTERS = ("compiles", "compiles_from_cache", "lazy_compiles", "lazy_compile_s")


class RemoteInstance:
  """An instance in its own process. `start` builds a fresh actor; `kill` ends its process;
  `restart` (after a kill) starts a new, empty one with the same programs.

  Pull epochs: every pull into this instance gets the next epoch (`next_epoch`); a pull the
  driver gives up on is `revoke`d, and every step and pull sent here afterwards carries the
  revoked epochs whose pull has not returned yet (`revoked`), so the actor drops such a pull
  before it scatters into pages the driver has given to another request."""

  hosts, addresses = 1, ()   # (set by finish_start: the hosts it spans, their servers)

  device_tokens = True

  def __init__(self, spec, new_actor, warm_up_args: dict):
    self.spec, self._new_actor, self._warm_up_args = spec, new_actor, dict(warm_up_args)
    self.name, self.role, self.opts, self.tp = spec.name, spec.role, spec.opts, spec.tp
    self.tables = BlockTables(spec.opts.num_pages, spec.opts.page_size)
    self.counters = dict.fromkeys(COUNTERS, 0)
    self.actor = None
    self.alive = False
    self.kv_streamer = None          # the run's RayTransfer, set by the launcher when
                                     # kv.stream_layers > 0: prefill may then stream KV
    self._epochs = itertools.count(1)
    self._revoked: dict[int, object] = {}   # epoch -> its RemoteTransfer (ray_transfer.py),
                                            # until the pull returns
    self.node = spec.node            # the run's node its actor is placed on
    self.store_of = None             # the launcher's node KV stores (a callable: node ->
    self.store = None                # store), for the host tier: its node's once attached
    self.seal_key = None             # the run's key when KV is sealed (kv.seal_cross_node:
                                     # P -> D between nodes, every node store's pages)
    self._offloads: list[tuple[int, bytes]] = []   # evicted pages to copy out before the
                                                   # actor's pool is written again
    self._reads: dict[int, object] = {}   # step seq -> the release of the host pages it reads
    self.store_timeout_s = STORE_TIMEOUT_S
    self.host_stats = {"offload_pages": 0, "load_pages": 0, "load_s": 0.0,
                       "remote_load_pages": 0}

  # ---- life cycle (the launcher starts many at once: start, then finish_start) ---------------

  def start(self):
    """Creates the actor and asks it to describe itself and warm up; returns the refs."""
    self.actor, self._seq = self._new_actor(self.spec), 0
    self._revoked.clear()            # a new process: no pull of the old one can land in it
    return self.actor.describe.remote(), self.actor.warm_up.remote(**self._warm_up_args)

  def finish_start(self, refs) -> None:
    info, counters = (ray_result(r, self.name) for r in refs)
    self.address, self.pid, self.platform = info["address"], info["pid"], info["platform"]
    self.page_bytes, self.ray_node_id = info["page_bytes"], info["ray_node_id"]
    self.overlap_by_default = info["overlap_by_default"]
    # (an instance over several hosts: each host's transfer server, host 0's first)
    self.hosts, self.addresses = info.get("hosts", 1), tuple(info.get("addresses",
                                                                      (self.address,)))
    self.counters = {k: counters[k] for k in COUNTERS}
    self.alive = True

  def kill(self) -> None:
    if self.actor is not None:
      ray.kill(self.actor, no_restart=True)
    self.alive = False
    self._offloads.clear()           # (their pages died with the process: drop_writer)
    for seq in list(self._reads):    # (its steps read nothing more)
      self.reads_done(seq)

  def reads_done(self, seq: int) -> None:
    """Step seq's host pages were read, or never will be: their tiers may let them go."""
    release = self._reads.pop(seq, None)
    if release is not None:
      release()

  # ---- the node's host KV tier (its bytes in the node store: node_store.py) ------------------

  def attach_host_tier(self, tier, host_bytes_per_s: float = 0.0,
                       handoff: str = "transfer") -> None:
    """Shares the node's host tier: this pool's evicted prefix pages are copied by the actor
    to the node's KV store (before anything writes the pool again), and reloads are fetched
    from it by the actor before the step that reads them. handoff: "transfer" only."""
    if handoff != "transfer":
      raise ValueError(f"host tier hand-off {handoff!r} needs cluster.launcher=local")
    self.store = self.store_of(self.node)
    tier.on_forget = lambda names: self.store.drop.remote(list(names))
    self.tables.attach_host(tier, self._offload, self.role == "decode")

  def kv_bytes(self, num_pages: int) -> int:
    return num_pages * self.page_bytes

  def _offload(self, page: int, name: bytes, salt: str) -> None:
    """The prefix cache's on_drop: offered now, readable once the actor has copied it."""
    if self.tables.host.offer(name, salt, salt, name, writer=self.name, ready_s=float("inf"),
                              now=0.0):
      self._offloads.append((page, name))

  def flush_offloads(self) -> None:
    """Copies the pages evicted since the last call to the store, waiting for it (at most
    store_timeout_s: then the tier is lost): called before any call that writes this actor's
    pool (a step, a pull into it), since those pages now belong to other sequences. A page the
    tier forgot since it was offered (a tenant flush) is not written: the store was told to
    drop it already, and a write after that would stay there for good."""
    if not self._offloads or not self.alive:
      return
    tier, offloads, self._offloads = self.tables.host, self._offloads, []
    wanted = {}                      # name -> page (a name offered twice: the same content)
    for page, name in offloads:
      if tier.in_flight(name, self.name, 0.0):
        wanted.setdefault(name, page)
    if not wanted:
      return
    names, pages = list(wanted), list(wanted.values())
    try:
      ray_result(self.actor.offload.remote(pages, names, self.store, self.seal_key), self.name,
                 self.store_timeout_s)
    except (HostTierLost, ray.exceptions.GetTimeoutError):
      self.lose_host_tier()
      return
    except InstanceLost:
      return                         # (the step sent next fails the same way: recovery)
    tier.land(names, self.name, 0.0)
    self.host_stats["offload_pages"] += len(pages)

  def lose_host_tier(self) -> None:
    """The node's KV store is gone (or does not answer): the tier is lost for the rest of the
    run."""
    tier = self.tables.host
    if tier is not None and not tier.lost:
      tier.lose()

  def restart(self) -> "PendingStart":
    """Starts a fresh process (its programs come from the compile cache where one is set)
    without waiting; the driver brings the instance back when the start is ready. The
    host-side tables were reset by the driver when the instance died."""
    return PendingStart(self, self.start())

  # ---- pull epochs ---------------------------------------------------------------------------

  def next_epoch(self) -> int:
    return next(self._epochs)

  def revoke(self, epoch: int, transfer) -> None:
    """The driver gave up on pull `epoch` (and will reuse its pages): it must never land."""
    self._revoked[epoch] = transfer

  def revoked(self) -> tuple[int, ...]:
    """The revoked epochs whose pull may still land (its call has not returned). A pull that
    returned is forgotten, its offer settled if it took it."""
    for epoch in [e for e, t in self._revoked.items() if is_ready(t.pull)]:
      self._revoked.pop(epoch).settle_if_taken()
    return tuple(self._revoked)

  # ---- what the driver reads -----------------------------------------------------------------

  @property
  def compiles(self) -> int:
    return self.counters["compiles"]

  @property
  def compiles_from_cache(self) -> int:
    return self.counters["compiles_from_cache"]

  @property
  def lazy_compiles(self) -> int:
    return self.counters["lazy_compiles"]

  @property
  def lazy_compile_s(self) -> float:
    return self.counters["lazy_compile_s"]

  # ---- steps ---------------------------------------------------------------------------------

  @property
  def streams_kv(self) -> bool:
    """prefill takes `streams` once the run's transfer function is set (`kv_streamer`)."""
    return self.kv_streamer is not None

  def prefill(self, seqs, prev: RemotePending | None = None, *,
              streams=None) -> RemotePending:
    """streams (kv.stream_layers): [(decode RemoteInstance, source pages, destination pages)],
    KV pulled actor to actor layer group by layer group while the step runs
    (`RayTransfer.streamed_prefill`); the result's `streams` holds the transfers."""
    if streams:
      return self.kv_streamer.streamed_prefill(self, seqs, prev, streams)
    return self.step("prefill", seqs, prev)

  def decode(self, seqs, prev: RemotePending | None = None) -> RemotePending:
    return self.step("decode", seqs, prev)

  def step(self, kind: str, seqs, prev: RemotePending | None, **offers) -> RemotePending:
    """One step call on the actor (offers: a streamed prefill's, see InstanceActor.step)."""
    seq, self._seq = self._seq, self._seq + 1
    self.flush_offloads()
    if self.tables.pending_loads:
      loads, self._reads[seq] = self.tables.take_loads_held()   # (released by its result)
      local = tuple((p, x) for p, x in loads if not isinstance(x, RemotePage))
      remote = tuple((p, x.payload, x.node) for p, x in loads if isinstance(x, RemotePage))
      offers.update(loads=local, store=self.store, seal_key=self.seal_key)   # (sealed: opened)
      if remote:   # (from other nodes' stores: kv.remote_store)
        offers.update(remote_loads=remote, stores={n: self.store_of(n) for _, _, n in remote})
        self.host_stats["remote_load_pages"] += len(remote)
      self.host_stats["load_pages"] += len(loads)
    ref = self.actor.step.remote(seq, kind, seqs, None if prev is None else prev.seq,
                                 self.revoked(), **offers)
    return RemotePending(ref, seq, self)


class PendingStart:
  """An actor starting: ready() once it has described itself and warmed up; result() finishes
  the instance's start (InstanceLost if the new process died)."""

  def __init__(self, instance: RemoteInstance, refs):
    self.instance, self.refs = instance, refs

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [r for r in self.refs if not is_ready(r)]

  def ready(self) -> bool:
    return all(is_ready(r) for r in self.refs)

  def result(self) -> None:
    self.instance.finish_start(self.refs)
