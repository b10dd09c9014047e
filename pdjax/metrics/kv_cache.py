"""The `kv_cache` object of summary.json: what the prefix cache saved, and how the page pools
were used (pure Python).

hit_rate_tokens: prompt tokens served from a prefill-side cache / prompt tokens of requests
that were prefilled; hit_rate_requests: share of those requests with any hit;
saved_prefill_tokens: the tokens not recomputed; decode_hit_tokens: prompt tokens a decode
instance already held, so their KV was not transferred; evictions / expiries: cached pages
dropped for space / for age, over all instances; cached_pages_at_end: pages still named;
hot_prefixes: the most-hit prefixes over all instances ({"salt", "prefix", "pages", "hits",
"saved_tokens"}); flushes: the tenant flushes that ran ({"t_s", "tenant", "pages"}).

Pool use (also with the cache off): internal_fragmentation is the share of allocated slots no
token occupies (the unused tail of each sequence's last page), over every state sample,
weighted by pages in use; pages_per_tenant is each tenant's peak pages on one instance, per
tier (the role the instance was built with).
"""

from __future__ import annotations

import collections

from pdjax.metrics import columns

HOT_PREFIXES = 5


def kv_cache_summary(requests, instances, samples=(), flushes=()) -> dict:
  prefilled = [r for r in requests if r.prefill_start_s is not None]
  prompt = sum(r.prompt_len for r in prefilled)
  cached = sum(r.cached_tokens for r in prefilled)
  caches = [i.tables.cache for i in instances if i.tables.cache is not None]
  return {
      "enabled": bool(caches),
      "eviction": caches[0].eviction if caches else None,
      "hit_rate_tokens": cached / prompt if prompt else 0.0,
      "hit_rate_requests": (sum(r.cached_tokens > 0 for r in prefilled) / len(prefilled)
                            if prefilled else 0.0),
      "saved_prefill_tokens": cached,
      "decode_hit_tokens": sum(r.decode_cached_tokens for r in requests),
      "evictions": sum(c.stats["evictions"] for c in caches),
      "expiries": sum(c.stats["expiries"] for c in caches),
      "cached_pages_at_end": sum(c.num_cached for c in caches),
      "hot_prefixes": hot_prefixes(caches),
      "flushes": list(flushes),
      "internal_fragmentation": internal_fragmentation(
          samples, instances[0].tables.page_size if instances else 1),
      "pages_per_tenant": pages_per_tenant(instances),
      **({"host_tier": host_tier_summary(instances)}
         if any(getattr(i.tables, "host", None) is not None for i in instances) else {}),
  }


def host_tier_summary(instances) -> dict:
  """The nodes' host tiers (one per node, cluster.nodes), their counts summed: pages offloaded
  into them, refused when full of writes in flight, evicted, flushed, lost with a dead writer;
  reload lookups and the pages they hit (of which read from another node's tier, and those
  found there but predicted slower than recomputing), the pages and bytes the instances moved
  over the host link and between nodes, their load time, and the pages each tenant (salt)
  holds at the end. capacity_pages: one node's."""
  tiers = list({id(i.tables.host): i.tables.host for i in instances
                if getattr(i.tables, "host", None) is not None}.values())
  moved = collections.Counter()
  for inst in instances:
    moved.update(getattr(inst, "host_stats", {}))
  page_bytes = instances[0].kv_bytes(1) if hasattr(instances[0], "kv_bytes") else 0
  s = collections.Counter()
  tenants = collections.Counter()
  for tier in tiers:
    s.update(tier.stats)
    tenants.update(tier.pages_by_owner())
  tier = tiers[0]
  return {
      "capacity_pages": tier.capacity, "policy": tier.policy,
      "admission": tier.admission.name, "nodes": len(tiers),
      "pages_at_end": sum(len(t) for t in tiers),
      "offloaded_pages": s["offloaded"], "not_admitted_pages": s["not_admitted"],
      "refused_pages": s["refused"],
      "evicted_pages": s["evictions"], "flushed_pages": s["flushed"],
      "lost_in_flight_pages": s["aborted"],
      # pages forgotten because their bytes did not read back (a sealed page that did not
      # open), and pages held by a tier whose store was lost
      "discarded_pages": s["discarded"], "lost_pages": s["lost"],
      "lookups": s["lookups"], "hit_lookups": s["hit_lookups"], "hit_pages": s["hit_pages"],
      "remote_hit_pages": s["remote_hit_pages"],
      "remote_declined_pages": s["remote_declined_pages"],
      "loaded_bytes": moved["load_pages"] * page_bytes,
      "remote_loaded_bytes": moved["remote_load_pages"] * page_bytes,
      "offloaded_bytes": moved["offload_pages"] * page_bytes,
      "load_s_total": moved["load_s"],
      "pages_per_tenant": dict(sorted(tenants.items())),
  }


def prefix_hits(caches) -> tuple[collections.Counter, dict]:
  """Hits per (salt, deepest name) summed over instances (same salt and name = same content),
  and each one's depth in pages."""
  hits: collections.Counter = collections.Counter()
  pages: dict = {}
  for c in caches:
    hits.update(c.prefix_hits)
    pages.update(c.prefix_pages)
  return hits, pages


def hot_prefixes(caches, top: int = HOT_PREFIXES) -> list[dict]:
  """The most-hit prefixes over all instances (`prefix_hits`)."""
  hits, pages = prefix_hits(caches)
  ranked = sorted(hits.items(), key=lambda kv: (-kv[1], -pages[kv[0]], kv[0]))[:top]
  page_size = caches[0].page_size if caches else 0
  return [{"salt": salt, "prefix": name.hex()[:16], "pages": pages[(salt, name)], "hits": n,
           "saved_tokens": n * pages[(salt, name)] * page_size}
          for (salt, name), n in ranked]


def internal_fragmentation(samples, page_size: int) -> float:
  has = columns.present(samples, "kv_slots_unused")
  pages, slots = columns.numbers(samples, ("kv_pages_used", "kv_slots_unused"),
                                 {"kv_pages_used": 0.0, "kv_slots_unused": 0.0})
  used = int(pages[has].sum()) * page_size     # (whole numbers: summed exactly in float64)
  unused = int(slots[has].sum())
  return unused / used if used else 0.0


def pages_per_tenant(instances) -> dict[str, dict[str, int]]:
  out: dict[str, dict[str, int]] = {}
  for inst in instances:
    for tenant, peak in inst.tables.peak_pages_by_owner.items():
      per = out.setdefault(tenant or "(none)", {})
      per[inst.role] = max(per.get(inst.role, 0), peak)
  return {t: dict(sorted(v.items())) for t, v in sorted(out.items())}
