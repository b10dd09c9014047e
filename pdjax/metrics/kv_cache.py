"""The `kv_cache` object of summary.json: what the prefix cache saved (pure Python).

hit_rate_tokens: prompt tokens served from a prefill-side cache / prompt tokens of requests
that were prefilled; hit_rate_requests: share of those requests with any hit;
saved_prefill_tokens: the tokens not recomputed; decode_hit_tokens: prompt tokens a decode
instance already held, so their KV was not transferred; evictions / expiries: cached pages
dropped for space / for age, over all instances; cached_pages_at_end: pages still named.
"""

from __future__ import annotations


def kv_cache_summary(requests, instances) -> dict:
  prefilled = [r for r in requests if r.prefill_start_s is not None]
  prompt = sum(r.prompt_len for r in prefilled)
  cached = sum(r.cached_tokens for r in prefilled)
  caches = [i.tables.cache for i in instances if i.tables.cache is not None]
  return {
      "enabled": bool(caches),
      "hit_rate_tokens": cached / prompt if prompt else 0.0,
      "hit_rate_requests": (sum(r.cached_tokens > 0 for r in prefilled) / len(prefilled)
                            if prefilled else 0.0),
      "saved_prefill_tokens": cached,
      "decode_hit_tokens": sum(r.decode_cached_tokens for r in requests),
      "evictions": sum(c.stats["evictions"] for c in caches),
      "expiries": sum(c.stats["expiries"] for c in caches),
      "cached_pages_at_end": sum(c.num_cached for c in caches),
  }
