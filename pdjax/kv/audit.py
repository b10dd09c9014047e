"""The KV layer's audit trail: `kv_audit.jsonl` in a run's folder (contract). Pure Python.

One line per KV lifecycle event, on the run's clock:

  offload  prefix pages written to the node's host tier (tier "host", instance: the writer)
  reload   host pages read back into an instance's pool (tier "host", instance: the reader)
  evict    cached pages dropped for space (tier "device": an instance's pool; "host": the
           node's tier, instance "")
  expire   idle cached pages dropped past kv.ttl_s (tier "device")
  flush    a tenant's pages forgotten (kv.flush_tenants): one line per instance pool and one
           for the host tier at each flush, pages 0 included, so a line per place shows the
           flush reached it

Fields: t_s, event, tier, instance, tenant (the page names' salt: "tenant:NAME", a shared
salt, or ".../salt:..." with a cache_salt), pages, bytes. Never token ids or page names.
Events at the same time with the same event, tier, instance and tenant are one line (a
request's eviction of 40 pages, each offloaded as it goes, is two lines, not 80), in the
order of their first event.
"""

from __future__ import annotations

AUDIT_EVENTS = ("offload", "reload", "evict", "expire", "flush")
AUDIT_FIELDS = ("t_s", "event", "tier", "instance", "tenant", "pages", "bytes")


class KvAudit:
  """Collects audit lines into `sink` (a list, or a spilled list for a long-lived server):
  the lines of the current time are merged, then written when the clock moves on or at
  `close`."""

  def __init__(self, clock, sink: list):
    self.clock, self.sink = clock, sink
    self._t: float | None = None
    self._lines: dict[tuple, dict] = {}   # this time's lines by (event, tier, instance, tenant)

  def record(self, event: str, tier: str, instance: str, tenant: str, pages: int,
             page_bytes: int) -> None:
    if event not in AUDIT_EVENTS:
      raise ValueError(f"unknown KV audit event {event!r} (known: {', '.join(AUDIT_EVENTS)})")
    t = round(self.clock(), 6)
    if t != self._t:
      self.close()
      self._t = t
    key = (event, tier, instance, tenant)
    line = self._lines.get(key)
    if line is None:
      self._lines[key] = {"t_s": t, "event": event, "tier": tier, "instance": instance,
                          "tenant": tenant, "pages": pages, "bytes": pages * page_bytes}
    else:
      line["pages"] += pages
      line["bytes"] += pages * page_bytes

  def close(self) -> None:
    for line in self._lines.values():
      self.sink.append(line)
    self._lines = {}
