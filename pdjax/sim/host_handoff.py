"""The P -> D hand-off through the node's host KV tier (kv.host_tier_handoff=host), an
alternative to the direct device-to-device transfer: the prefill instance writes the request's
full prompt pages to the host tier (write-through: they stay there for any instance of the
node to reload later), the decode instance reads them back; the partial last page, which has
no prefix name, still goes over the direct link, at the same time. The hand-off lands when both
are done: max(host write + host read, direct copy of the rest).
"""

from __future__ import annotations

from pdjax.sim.transfer import SimTransfer


def via_host_tier(src, src_pages: list[int], dst, dst_pages: list[int]) -> SimTransfer:
  """src, dst: SimInstances (sim/instance.py, which calls this when src.handoff is "host")."""
  cache, tier, now = src.tables.cache, src.tables.host, src.clock.now()
  named = [(p, cache.name_of(p)) for p in src_pages]
  through_host = [(p, entry) for p, entry in named if entry is not None]
  direct = len(src_pages) - len(through_host)
  write_s = src._host_copy_s(len(through_host)) if through_host else 0.0
  for page, (name, salt) in through_host:
    if tier.offer(name, salt, salt, src.digests[page], writer=src.name, ready_s=now + write_s,
                  now=now):
      src.host_stats["offload_pages"] += 1
  read_s = dst._host_copy_s(len(through_host)) if through_host else 0.0
  dst.host_stats["load_pages"] += len(through_host)
  dst.host_stats["load_s"] += read_s
  direct_bytes = src.kv_bytes(src.cost.moved_pages(direct)) if direct else 0.0
  direct_s = src.cost.transfer_s(direct_bytes) if direct else 0.0
  num_bytes = src.kv_bytes(len(through_host)) + direct_bytes
  return SimTransfer(src, list(src_pages), dst, list(dst_pages), num_bytes,
                     max(write_s + read_s, direct_s))
