"""KV transfers to and from instances that span hosts (issue 48): the InstanceActor's side.

A source host offers, for each destination host, the items it holds for that host's devices
under that pair's transfer id (`host_pieces.host_uuid`); a destination host pulls from each
source host the items for its own devices. Which items: `host_pieces`, from both instances'
(tp, hosts). A single-host instance is the case hosts = 1 on its side (it offers one list per
destination host of a multi-host puller, or pulls from each host of a multi-host source).

That every destination host has its pieces before any writes them is the instance's business
(host_group.py: host 0 stages the pull on every host, then lands it on every host, or on none).
"""

from __future__ import annotations

import asyncio

from pdjax.distributed import host_pieces
from pdjax.engine import transfer


class HostTransferMixin:
  """Needs the InstanceActor's inst, server, _connections, _offered, _offers."""

  hosts = 1        # this instance's hosts, and this actor's index among them
  host_index = 0

  def _offer_by_host(self, uuid: int, shards: list, dst_tp: int, dst_hosts: int,
                     ttl_s: float) -> None:
    """Offers this host's items (the others are None in `shards`) per destination host."""
    pairs = transfer.piece_hosts(self.inst.tp, self.hosts, dst_tp, dst_hosts)
    subs = []
    for d, ks in host_pieces.offers_of(self.host_index, len(shards) // dst_tp, pairs).items():
      sub = host_pieces.host_uuid(uuid, d)
      self._offered(sub, [shards[k] for k in ks], ttl_s)
      subs.append(sub)
    self._split_offers[uuid] = subs
    asyncio.get_running_loop().call_later(ttl_s, self._split_offers.pop, uuid, None)

  def _settle_split(self, uuid: int) -> None:
    for sub in self._split_offers.pop(uuid, ()):
      self._offers.pop(sub, None)

  def _pull_by_host(self, uuid: int, avals: list, sources: tuple) -> list:
    """Starts the pulls of this host's items from each source host that holds some: the
    arrays in item order, None for items other hosts take. sources: (source tp, source
    hosts, each source host's transfer server address)."""
    src_tp, src_hosts, addresses = sources
    pairs = transfer.piece_hosts(src_tp, src_hosts, self.inst.tp, self.hosts)
    arrays: list = [None] * len(avals)
    for s, ks in host_pieces.pulls_of(self.host_index, len(avals) // self.inst.tp,
                                      pairs).items():
      address = addresses[s]
      if address not in self._connections:
        self._connections[address] = self.server.connect(address)
      got = self._connections[address].pull(host_pieces.host_uuid(uuid, self.host_index),
                                            [avals[k] for k in ks])
      for k, a in zip(ks, got):
        arrays[k] = a
    return arrays
