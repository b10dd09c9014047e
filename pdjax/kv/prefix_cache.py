"""Automatic prefix caching for one instance's page pool (pure Python, deterministic).

A full page is named by a hash chained over (salt, the previous page's hash, the page's token
ids), as in vLLM's automatic prefix caching: equal names mean equal KV, so a request whose
leading pages are cached reuses them (refcount + 1) and prefills only the rest. The salt is
the tenant's own unless an explicit shared salt is configured, so one tenant can never hit
(or time) another tenant's prefix.

The cache holds one reference on every page it names. A cached page that no sequence uses
(refcount 1: the cache's own) is *evictable*: it stays until its space is needed (least
recently used first by default; `eviction="lfu"` drops the least-hit page first, ties by
recency), until more than `capacity_pages` pages are cached, until it is older than `ttl_s`
since last use, or until its salt is flushed. Allocation evicts on demand, so a cached page
never blocks a request that would otherwise fit.

Hits are counted per page and per *prefix* (the deepest page a request matched, with its
depth), which is what the summary's hot prefixes report: the shared system prompts and documents that earn the
cache its keep.
"""

from __future__ import annotations

import collections
import hashlib
import struct

from pdjax.errors import DeviceError

EVICTION_POLICIES = ("lru", "lfu")


def salt_for(tenant: str, shared_salt: str = "", cache_salt: str = "") -> str:
  """The salt a tenant's page names use: its own, unless a shared salt opts into sharing; a
  request's cache_salt (vLLM's field) narrows it further: only requests with the same one
  share pages."""
  base = shared_salt or f"tenant:{tenant}"
  return f"{base}/salt:{cache_salt}" if cache_salt else base


def under_salt(page_salt: str, salt: str) -> bool:
  """Whether a page named under page_salt belongs to salt: the same, or salt narrowed by a
  request's cache_salt (salt_for's "/salt:" suffix)."""
  return page_salt == salt or page_salt.startswith(salt + "/salt:")


def flush_tenant(tables, tenant: str, shared_salt: str = "") -> int:
  """Forgets every cached page of `tenant` in each of these BlockTables and in the host tier
  they share, if any (its data can no longer be hit, so no later request can reuse or time
  it); pages live sequences still use stay theirs. With a shared salt the whole shared cache
  goes. Returns pages forgotten (both tiers).""" 
  salt = salt_for(tenant, shared_salt)
  tables = list(tables)
  hosts = {id(t.host): t.host for t in tables if getattr(t, "host", None) is not None}
  return (sum(t.cache.flush(salt) for t in tables if t.cache is not None)
          + sum(h.flush(salt) for h in hosts.values()))   # and the node's host tier


def prefix_names(salt: str, token_ids, page_size: int) -> list[bytes]:
  """Names of the full pages a request can reuse: all but the last token stay to compute."""
  return page_hashes(salt, token_ids, page_size, (len(token_ids) - 1) // page_size)


def page_hashes(salt: str, token_ids, page_size: int, num_pages: int) -> list[bytes]:
  """Chained names of the first num_pages full pages of token_ids."""
  out, prev = [], salt.encode()
  for i in range(num_pages):
    page = token_ids[i * page_size:(i + 1) * page_size]
    digest = hashlib.blake2b(prev + struct.pack(f"<{len(page)}q", *page), digest_size=16)
    prev = digest.digest()
    out.append(prev)
  return out


# Most prefixes whose hits a cache counts (it prunes to this many, the most hit, once it holds
# twice as many): the hot-prefix report shows the top few; a long-lived server must not keep
# one entry per distinct prompt it ever saw (issue 47, item 5).
TRACKED_PREFIXES = 4096


class PrefixCache:

  def __init__(self, allocator, page_size: int, *, capacity_pages: int = 0, ttl_s: float = 0.0,
               eviction: str = "lru"):
    """capacity_pages: most pages named at once (0: the whole pool); ttl_s: 0 = no expiry;
    eviction: "lru" | "lfu"."""
    if eviction not in EVICTION_POLICIES:
      raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
    self.allocator, self.page_size = allocator, page_size
    self.capacity = capacity_pages or allocator.num_pages
    self.ttl_s, self.eviction = ttl_s, eviction
    self._page_hits: collections.Counter[int] = collections.Counter()   # cached page -> hits
    self.prefix_hits: collections.Counter[tuple[str, bytes]] = collections.Counter()
    self.prefix_pages: dict[tuple[str, bytes], int] = {}   # (salt, deepest name) -> depth
    self._page_of: dict[bytes, int] = {}
    self._entry: dict[int, tuple[bytes, str]] = {}       # page -> (name, salt)
    self._idle: collections.OrderedDict[int, float] = collections.OrderedDict()  # LRU, last use
    self.stats = collections.Counter()   # evictions, expiries
    # Called with (page, name, salt) just before an evicted or expired page is dropped (its
    # content still intact): the host tier's offload (pdjax/kv/host_tier.py). A DeviceError
    # it raises (the device failed copying the page) is kept in `offload_error` and the page
    # is dropped without its copy, so the eviction under way completes and the tables stay
    # consistent; the driver then treats the instance as dead (Steps._offload_failed).
    self.on_drop = None
    self.offload_error: DeviceError | None = None
    # Called with (event, salt, pages) for the audit trail (kv/audit.py): "evict", "expire",
    # "flush" (BlockTables.attach_audit); None: not audited.
    self.on_event = None

  # ---- lookups --------------------------------------------------------------------------

  def match(self, salt: str, token_ids, max_pages: int) -> tuple[list[int], list[bytes]]:
    """The cached pages of the longest cached prefix (at most max_pages), and the names of
    all max_pages leading pages (to register them once computed)."""
    names = page_hashes(salt, token_ids, self.page_size, max_pages)
    return [self._page_of[name] for name in names[:self.held(names)]], names

  def held(self, names: list[bytes]) -> int:
    """How many of these leading page names are cached (a prefix, so it stops at a miss)."""
    n = 0
    for name in names:
      if name not in self._page_of:
        break
      n += 1
    return n

  def name_of(self, page: int) -> tuple[bytes, str] | None:
    """(name, salt) of a cached page; None when the page is not named."""
    return self._entry.get(page)

  def hits_of(self, page: int) -> int:
    """How often sequences took this cached page (acquire) since it was named."""
    return self._page_hits[page]

  def idle_since(self, page: int) -> float:
    """When an evictable page was last used (released or named); 0 when in use."""
    return self._idle.get(page, 0.0)

  def num_idle(self, pages: list[int]) -> int:
    """How many of these pages are evictable right now."""
    return sum(1 for p in pages if p in self._idle)

  def acquire(self, pages: list[int]) -> None:
    """A sequence takes the matched pages (refcount + 1; no longer evictable): a hit."""
    self.allocator.incref(pages)
    for p in pages:
      self._idle.pop(p, None)
      self._page_hits[p] += 1
    if pages:
      name, salt = self._entry[pages[-1]]
      self.prefix_hits[(salt, name)] += 1
      self.prefix_pages[(salt, name)] = len(pages)
      if len(self.prefix_hits) > 2 * TRACKED_PREFIXES:
        self._prune_prefix_counts()

  def _prune_prefix_counts(self) -> None:
    """Keep the TRACKED_PREFIXES most-hit prefixes (ties: the deeper, then the name), so a
    server that sees endless distinct prompts holds a bounded table. Amortised: it runs once
    per TRACKED_PREFIXES new prefixes. A prefix dropped here and hit again later counts from
    zero: the hot-prefix report (metrics/kv_cache.hot_prefixes) is exact for prefixes that
    stay among the most hit, which are the ones it shows."""
    keep = sorted(self.prefix_hits.items(),
                  key=lambda kv: (-kv[1], -self.prefix_pages[kv[0]], kv[0]))[:TRACKED_PREFIXES]
    self.prefix_hits = collections.Counter(dict(keep))
    self.prefix_pages = {k: self.prefix_pages[k] for k, _ in keep}

  def insert(self, names: list[bytes], pages: list[int], salt: str, now: float) -> int:
    """Names computed full pages (the cache takes a reference); already-named content and
    already-cached pages are skipped. Returns how many pages were added."""
    added = 0
    for name, page in zip(names, pages):
      if name in self._page_of or page in self._entry:
        continue
      while len(self._entry) >= self.capacity and self._evict_one():
        pass
      if len(self._entry) >= self.capacity:
        break
      self.allocator.incref([page])
      self._page_of[name], self._entry[page] = page, (name, salt)
      if self.allocator.refcount(page) == 1:
        self._idle[page] = now
      added += 1
    return added

  def release(self, pages, now: float) -> None:
    """After a sequence dropped its references: its cached pages that nobody else uses become
    evictable, most recently used last."""
    for p in pages:
      if p in self._entry and self.allocator.refcount(p) == 1:
        self._idle[p] = now
        self._idle.move_to_end(p)

  # ---- space ----------------------------------------------------------------------------

  @property
  def num_cached(self) -> int:
    return len(self._entry)

  @property
  def num_evictable(self) -> int:
    return len(self._idle)

  def cached_pages(self) -> set[int]:
    return set(self._entry)

  def evict(self, n: int) -> int:
    """Frees up to n evictable pages, least recently used first; returns how many."""
    done = 0
    while done < n and self._evict_one():
      done += 1
    return done

  def expire(self, now: float) -> int:
    """Drops evictable pages idle for longer than ttl_s."""
    if not self.ttl_s:
      return 0
    old = []
    for p, t in self._idle.items():   # least recently used first: stop at the first fresh one
      if now - t <= self.ttl_s:
        break
      old.append(p)
    for p in old:
      self._offload(p)
      self._audit("expire", p)
      self._drop(p)
    self.stats["expiries"] += len(old)
    return len(old)

  def flush(self, salt: str) -> int:
    """Forgets every page named under `salt` (and its cache_salt narrowings: under_salt):
    nothing of it can be hit again. Pages still used by live sequences stay theirs; the rest
    return to the free list. Returns pages forgotten."""
    pages = [p for p, (_, s) in self._entry.items() if under_salt(s, salt)]
    for p in pages:
      self._drop(p)
    if self.on_event is not None:   # (pages 0 too: the audit shows the flush reached here)
      self.on_event("flush", salt, len(pages))
    return len(pages)

  def clear(self) -> int:
    """Forgets every cached page (the device state is gone); returns how many."""
    pages = list(self._entry)
    for p in pages:
      self._drop(p)
    return len(pages)

  def _evict_one(self) -> bool:
    if not self._idle:
      return False
    if self.eviction == "lfu":   # least hits; min() keeps the first (least recent) of ties
      victim = min(self._idle, key=self._page_hits.__getitem__)
    else:
      victim = next(iter(self._idle))
    self._offload(victim)
    self._audit("evict", victim)
    self._drop(victim)
    self.stats["evictions"] += 1
    return True

  def _audit(self, event: str, page: int) -> None:
    if self.on_event is not None:
      self.on_event(event, self._entry[page][1], 1)

  def take_offload_error(self) -> DeviceError | None:
    """The first offload failure since the last call (None if none), cleared."""
    error, self.offload_error = self.offload_error, None
    return error

  def _offload(self, page: int) -> None:
    if self.on_drop is None or self.offload_error is not None:   # (no copy off a failed device)
      return
    name, salt = self._entry[page]
    try:
      self.on_drop(page, name, salt)
    except DeviceError as e:   # expected: the driver kills the instance (see on_drop above)
      self.offload_error = e

  def _drop(self, page: int) -> None:
    name, _ = self._entry.pop(page)
    del self._page_of[name]
    self._idle.pop(page, None)
    self._page_hits.pop(page, None)
    self.allocator.free([page])
