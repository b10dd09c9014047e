"""Which host sends and which host takes each piece of a KV transfer when an instance spans
hosts (issue 48). Pure Python.

A transfer's pieces (engine/transfer.py `gather_shards`) are slot-major: item k = p * dst_tp + j
is slot p's slice for destination device j, held by one source device. With hosts, a source
host holds the items whose source device is its own and a destination host takes the items
of its own devices (`transfer.piece_hosts`), so each (source host, destination host) pair
moves its own list of items, in k order, under its own transfer id: the offer's uuid plus the
destination host in the high bits (`host_uuid`). Both ends compute the same lists from the
two instances' (tp, hosts), so nothing else is exchanged.
"""

from __future__ import annotations

HOST_UUID_SHIFT = 56    # a transfer's uuids stay below 2**52 (ray_transfer.RayTransfer)
MAX_HOSTS = 64          # hosts of one instance (config.py refuses more)


def host_uuid(uuid: int, dst_host: int) -> int:
  """The transfer id of offer `uuid`'s items for destination host dst_host (host 0: uuid)."""
  return uuid + (dst_host << HOST_UUID_SHIFT)


def items_by_pair(num_slots: int, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], list]:
  """{(source host, destination host): [item k, ...]} over num_slots slots, each list in k
  order. pairs[j]: (source host, destination host) of destination device j."""
  out: dict[tuple[int, int], list] = {}
  per = len(pairs)
  for p in range(num_slots):
    for j, pair in enumerate(pairs):
      out.setdefault(pair, []).append(p * per + j)
  return out


def offers_of(src_host: int, num_slots: int, pairs) -> dict[int, list]:
  """{destination host: [item k, ...]} that source host src_host offers (non-empty only)."""
  return {d: ks for (s, d), ks in items_by_pair(num_slots, pairs).items() if s == src_host}


def pulls_of(dst_host: int, num_slots: int, pairs) -> dict[int, list]:
  """{source host: [item k, ...]} that destination host dst_host pulls (non-empty only)."""
  return {s: ks for (s, d), ks in items_by_pair(num_slots, pairs).items() if d == dst_host}
