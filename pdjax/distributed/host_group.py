"""An instance that spans hosts (`cluster.<tier>.hosts` > 1, issue 48): one Ray actor per host,
the hosts one multi-controller JAX group.

    driver ── step / warm_up ──► host 0 (HostGroupActor: the instance the driver sees)
                                   │ the same call, same arguments, sent first
                                   ▼
                                 hosts 1 .. H-1 (HostGroupActor, owned by host 0)

Every host calls `jax.distributed.initialize` (host 0 runs the coordinator; CPU collectives go
over gloo, TPU/GPU use the platform's own), so `jax.devices()` is the instance's tp devices
over all hosts and each builds the same `engine.Instance` on them: the parameters are
device_put from each host's own copy, each host holding its shards. A program over those
devices runs only when every host has launched it, so every host must run the same programs
in the same order: host 0 forwards each call the driver makes to its peers (before running
it itself: a peer never waits on a call host 0 has not sent) and each host keeps the steps'
sequence order (`InstanceActor._in_order`). Tokens are replicated over the mesh: host 0
returns them, having seen every peer's call end.

Failures: a peer that died (its process killed, or its node lost) fails the call with
InstanceLost and the driver treats the whole instance as dead; the peers are actors host 0
created, so killing host 0 (what the driver does to a dead instance) ends them too (Ray kills
the actors an actor owns when it dies). A call that does not end within
`cluster.collective_timeout_s` (a collective some host never joins) fails the same way,
instead of hanging the driver.

KV to and from a multi-host instance: every host of the source gathers (one program) and
offers the items on its devices, every host of the destination pulls the items of its own
devices from the source hosts that hold them (host_transfer.py, host_pieces.py), and host 0 of
the destination has them written only once every host has all of its own (`pull`): a late or
failed pull on one host fails the transfer on all of them, nothing written, and the driver
retries it as any failed transfer. Not yet across hosts (refused by the config): the node KV
store (host tier), sealed transfers, layer-group streams and re-meshing. See docs/guide.md "On a TPU
pod or several GPU nodes".
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

from pdjax.distributed.actor import ActorSpec, InstanceActor
from pdjax.errors import DeviceError, InstanceLost


JOIN_TIMEOUT_S = 300   # the longest a host waits for the others to join its group (a host
                       # that never starts fails the instance's start, as a dead actor)


@dataclasses.dataclass(frozen=True)
class HostGroup:
  """Where one host of a multi-host instance stands (picklable)."""
  hosts: int
  index: int = 0                     # 0: the host the driver calls (it starts the others)
  coordinator: str = ""              # host 0's "ip:port" (set by host 0 for its peers)
  platform: str = "cpu"              # cpu: collectives over gloo
  collective_timeout_s: float = 300.0
  peer_options: tuple = ()           # (per peer index 1..H-1) the Ray options of its actor


def _free_port(host: str) -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def join_group(group: HostGroup) -> None:
  """This process joins its instance's JAX group (before anything touches the devices)."""
  import jax
  if group.platform == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(group.coordinator, num_processes=group.hosts,
                             process_id=group.index, initialization_timeout=JOIN_TIMEOUT_S)


class HostGroupActor(InstanceActor):
  """One host of a multi-host instance (see the module doc). Host 0 starts the others."""

  def __init__(self, spec: ActorSpec, group: HostGroup):
    self.group, self._peers = group, []
    self.hosts, self.host_index = group.hosts, group.index
    self._staged: dict[int, list] = {}   # epoch -> a staged pull's pieces (until landed)
    if group.index == 0:
      import ray
      ip = ray.util.get_node_ip_address()
      group = dataclasses.replace(group, coordinator=f"{ip}:{_free_port(ip)}")
      remote = ray.remote(HostGroupActor)
      self._peers = [remote.options(**options).remote(
          spec, dataclasses.replace(group, index=i + 1, peer_options=()))
                     for i, options in enumerate(group.peer_options)]
    join_group(group)
    super().__init__(spec)

  async def _all(self, method: str, *args, _bounded: bool = True, **kwargs) -> list:
    """Runs `method` here and on every peer (sent to them first); every host's result (host
    0's first), once every host's call has ended. A peer gone (whatever host 0's own call
    raised meanwhile: its collectives fail when a peer dies) or a call past
    collective_timeout_s (unless not _bounded: a warm-up, whose compiles may take longer):
    InstanceLost, the instance is dead. Otherwise host 0's error, else the first peer's. Host
    0's own call is InstanceActor's method where it has one."""
    import ray
    refs = [getattr(p, method).remote(*args, **kwargs) for p in self._peers]
    own = getattr(super(), method, None) or getattr(self, method)
    try:
      done = await asyncio.wait_for(
          asyncio.gather(own(*args, **kwargs), *refs, return_exceptions=True),
          self.group.collective_timeout_s if _bounded else None)
    except asyncio.TimeoutError:
      raise InstanceLost(f"{self.inst.name}: a {method} over its {self.group.hosts} hosts did "
                         f"not end within cluster.collective_timeout_s="
                         f"{self.group.collective_timeout_s:g}") from None
    lost = [i for i, d in enumerate(done[1:], 1) if isinstance(d, ray.exceptions.RayActorError)]
    if lost:
      raise InstanceLost(f"{self.inst.name}: host {lost[0]} of its {self.group.hosts} is gone "
                         f"({type(done[lost[0]]).__name__})")
    for d in done:
      if isinstance(d, ray.exceptions.RayTaskError):
        raise d.as_instanceof_cause()
      if isinstance(d, BaseException):
        raise d
    return done

  async def describe(self) -> dict:
    info = await super().describe()
    if self.group.index:
      return info
    peers = await asyncio.gather(*[p.describe.remote() for p in self._peers])
    return {**info, "hosts": self.group.hosts,
            "addresses": [info["address"], *(d["address"] for d in peers)]}

  async def warm_up(self, *args, **kwargs) -> dict:
    if self.group.index:
      return await super().warm_up(*args, **kwargs)
    return (await self._all("warm_up", *args, _bounded=False, **kwargs))[0]

  async def step(self, *args, **kwargs) -> dict:
    if self.group.index:
      return await super().step(*args, **kwargs)
    return (await self._all("step", *args, **kwargs))[0]

  async def offer(self, *args, **kwargs) -> int:
    """Every host gathers (one program over the instance) and offers the items it holds."""
    if self.group.index:
      return await super().offer(*args, **kwargs)
    return sum(await self._all("offer", *args, **kwargs))

  async def settle(self, uuids: list[int]) -> None:
    if self.group.index:
      return await super().settle(uuids)
    await self._all("settle", uuids)

  async def pull(self, uuid: int, address: str, pages: list[int], timeout_s: float,
                 epoch: int = 0, revoked: tuple[int, ...] = (),
                 layers: tuple[int, int] | None = None, sources: tuple | None = None) -> dict:
    """Every host pulls the pieces of its own devices (`stage`); only once all have them does
    host 0 have every host write them (`land_staged`): one host's failed or late pull fails
    the transfer on all, with nothing written anywhere (each drops what it staged)."""
    start = time.perf_counter()
    try:
      await self._all("stage", uuid, address, pages, timeout_s, epoch, revoked, layers, sources)
      self._check_epoch(epoch, address)   # (host 0 decides for all: it sees revocations first)
      done = await self._all("land_staged", epoch, address, pages, layers)
    except DeviceError:
      await asyncio.gather(*[p.unstage.remote(epoch) for p in self._peers],
                           return_exceptions=True)
      self.unstage_now(epoch)
      raise
    self._revoked.discard(epoch)
    return {"bytes": sum(d["bytes"] for d in done), "seconds": time.perf_counter() - start}

  async def stage(self, uuid: int, address: str, pages: list[int], timeout_s: float,
                  epoch: int, revoked: tuple[int, ...], layers, sources) -> bool:
    """This host's pieces of a pull, fetched and kept until `land_staged` (or `unstage`)."""
    self._revoked.update(revoked)
    layers = None if layers is None else tuple(layers)
    if self._stalled_pulls > 0:          # (fault injection: stall_pulls)
      self._stalled_pulls -= 1
      await asyncio.sleep(timeout_s)
      raise DeviceError(f"KV pull from {address} not complete after {timeout_s:g} s (host "
                        f"{self.group.index})")
    self._staged[epoch] = await self._fetch(uuid, address, pages, timeout_s, epoch,
                                            time.perf_counter(), layers, sources)
    return True

  async def land_staged(self, epoch: int, address: str, pages: list[int], layers) -> dict:
    arrays = self._staged.pop(epoch)
    self._revoked.discard(epoch)         # (host 0 checked it for the instance)
    return self._land(arrays, address, pages, epoch, 0.0,
                      None if layers is None else tuple(layers))

  async def unstage(self, epoch: int) -> None:
    self.unstage_now(epoch)

  def unstage_now(self, epoch: int) -> None:
    self._staged.pop(epoch, None)
    self._revoked.discard(epoch)

  _stalled_pulls = 0

  async def stall_pulls(self, n: int) -> None:
    """Fault injection: this host's next n staged pulls never complete (each fails at its
    deadline), as a host whose transfer server stopped answering."""
    self._stalled_pulls = n

  async def peer_pids(self) -> list[int]:
    """The process ids of the peers (tests kill one)."""
    return [d["pid"] for d in await asyncio.gather(*[p.describe.remote() for p in self._peers])]

  async def stall_peer_pulls(self, host: int, n: int) -> None:
    """stall_pulls(n) on peer `host` (1..H-1)."""
    await self._peers[host - 1].stall_pulls.remote(n)
