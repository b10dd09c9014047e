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

Not yet across hosts (refused by the config): KV transfers to or from a multi-host instance,
the node KV store (host tier), layer-group streams and re-meshing. See docs/guide.md "On a TPU
pod or several GPU nodes".
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket

from pdjax.distributed.actor import ActorSpec, InstanceActor
from pdjax.errors import InstanceLost


@dataclasses.dataclass(frozen=True)
class HostGroup:
  """Where one host of a multi-host instance stands (picklable)."""
  hosts: int
  index: int = 0                     # 0: the host the driver calls (it starts the others)
  coordinator: str = ""              # host 0's "ip:port" (set by host 0 for its peers)
  platform: str = "cpu"              # cpu: collectives over gloo
  collective_timeout_s: float = 120.0
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
                             process_id=group.index,
                             initialization_timeout=int(group.collective_timeout_s))


class HostGroupActor(InstanceActor):
  """One host of a multi-host instance (see the module doc). Host 0 starts the others."""

  def __init__(self, spec: ActorSpec, group: HostGroup):
    self.group, self._peers = group, []
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

  async def _all(self, method: str, *args, **kwargs):
    """Runs `method` here and on every peer (sent to them first); host 0's result, once every
    host's call has ended. A peer gone (whatever host 0's own call raised meanwhile: its
    collectives fail when a peer dies) or a call past collective_timeout_s: InstanceLost, the
    instance is dead. Otherwise host 0's error, else the first peer's."""
    import ray
    refs = [getattr(p, method).remote(*args, **kwargs) for p in self._peers]
    own = getattr(super(), method)(*args, **kwargs)
    try:
      done = await asyncio.wait_for(asyncio.gather(own, *refs, return_exceptions=True),
                                    self.group.collective_timeout_s)
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
    return done[0]

  async def warm_up(self, *args, **kwargs) -> dict:
    if self.group.index:
      return await super().warm_up(*args, **kwargs)
    return await self._all("warm_up", *args, **kwargs)

  async def step(self, *args, **kwargs) -> dict:
    if self.group.index:
      return await super().step(*args, **kwargs)
    return await self._all("step", *args, **kwargs)

  async def peer_pids(self) -> list[int]:
    """The process ids of the peers (tests kill one)."""
    return [d["pid"] for d in await asyncio.gather(*[p.describe.remote() for p in self._peers])]
