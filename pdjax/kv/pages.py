"""Host-side paged KV bookkeeping: a page allocator with refcounts and block tables.

The device holds the KV cache as a pool of fixed-size pages; this module decides which
pages each sequence owns. Pure Python (no jax), deterministic (lowest free page first),
so schedulers and tests can reason about exact page lists.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Iterable

from pdjax.kv.prefix_cache import PrefixCache, page_hashes
from pdjax.kv.remote_store import RemotePage


class OutOfPages(Exception):
  """Raised when an allocation needs more pages than are free."""


class PageAllocator:
  """Pages 0..num_pages-1 with a min-heap free list and per-page refcounts."""

  def __init__(self, num_pages: int):
    if num_pages < 0:
      raise ValueError(f"num_pages must be >= 0, got {num_pages}")
    self._num_pages = num_pages
    self._refcount = [0] * num_pages
    self._free = list(range(num_pages))  # A sorted list is a valid heap.

  @property
  def num_pages(self) -> int:
    return self._num_pages

  @property
  def num_free(self) -> int:
    return len(self._free)

  @property
  def num_used(self) -> int:
    return self._num_pages - len(self._free)

  def can_allocate(self, n: int) -> bool:
    return 0 <= n <= len(self._free)

  def allocate(self, n: int) -> list[int]:
    """Returns the n lowest-numbered free pages, each with refcount 1."""
    if n < 0:
      raise ValueError(f"cannot allocate {n} pages")
    if n > len(self._free):
      raise OutOfPages(f"need {n} pages, {self.num_free} free")
    pages = [heapq.heappop(self._free) for _ in range(n)]
    for p in pages:
      self._refcount[p] = 1
    return pages

  def incref(self, pages: Iterable[int]) -> None:
    """Adds a holder to each (used) page, e.g. a sequence sharing a prefix."""
    pages = list(pages)
    for p in pages:
      self._check_range(p)
      if self._refcount[p] == 0:
        raise ValueError(f"page {p} is free")
    for p in pages:
      self._refcount[p] += 1

  def free(self, pages: Iterable[int]) -> None:
    """Drops one holder per listed page; pages at refcount 0 return to the free list."""
    counts = collections.Counter(pages)
    for p, c in counts.items():
      self._check_range(p)
      if self._refcount[p] < c:
        raise ValueError(f"page {p} is already free")
    for p, c in counts.items():
      self._refcount[p] -= c
      if self._refcount[p] == 0:
        heapq.heappush(self._free, p)

  def refcount(self, page: int) -> int:
    self._check_range(page)
    return self._refcount[page]

  def is_free(self, page: int) -> bool:
    return self.refcount(page) == 0

  def _check_range(self, page: int) -> None:
    if not 0 <= page < self._num_pages:
      raise ValueError(f"page {page} out of range [0, {self._num_pages})")


class _Release:
  """Releases taken host pages (tier, name) in their tiers, once."""

  def __init__(self, pins: list[tuple[object, bytes]]):
    self._pins = pins

  def __call__(self) -> None:
    pins, self._pins = self._pins, []
    by_tier: dict[int, tuple[object, list[bytes]]] = {}
    for tier, name in pins:
      by_tier.setdefault(id(tier), (tier, []))[1].append(name)
    for tier, names in by_tier.values():
      tier.release(names)


class BlockTables:
  """Sequence id -> list of pages (its block table), backed by a PageAllocator."""

  def __init__(self, num_pages: int, page_size: int):
    if page_size < 1:
      raise ValueError(f"page_size must be >= 1, got {page_size}")
    self.page_size = page_size
    self.allocator = PageAllocator(num_pages)
    self._tables: dict[str, list[int]] = {}
    self.cache = None                       # a PrefixCache once enable_prefix_cache() runs
    self.host = None                        # a node's HostTier once attach_host() runs
    self.remote = None                      # other nodes' tiers (a RemoteReload, set by the
                                            # run with kv.remote_store: runner/build.py)
    self.audit = None                       # (event, tier, salt, pages) once attach_audit()
    self.pending_loads: dict[int, object] = {}   # page -> host payload to write before the
                                                 # next step (a prefix reloaded from the host)
    self._pins: dict[int, tuple[object, bytes]] = {}   # pending load's page -> (the tier it
                                                       # was taken from, its name): pinned
                                                       # there until read (take_loads)
    self._names: dict[str, tuple[list[bytes], str]] = {}   # seq -> (page names, salt)
    # Accounting for reports: pages and tokens each table holds (the unused tail of its last
    # page is internal fragmentation), and pages held per owner (tenant), now and at peak.
    self._held: dict[str, tuple[int, int, str]] = {}      # seq -> (pages, tokens, owner)
    self.num_unused_slots = 0
    self.pages_by_owner: collections.Counter[str] = collections.Counter()
    self.peak_pages_by_owner: dict[str, int] = {}

  def enable_prefix_cache(self, capacity_pages: int = 0, ttl_s: float = 0.0,
                          eviction: str = "lru") -> None:
    self.cache = PrefixCache(self.allocator, self.page_size, capacity_pages=capacity_pages,
                             ttl_s=ttl_s, eviction=eviction)

  def attach_host(self, tier, offload, receives_copies: bool = False) -> None:
    """Shares a node's host tier (kv/host_tier.py): prefix pages evicted or expired from this
    pool go to offload(page, name, salt) (which writes them to the tier), and allocate_prefix
    reloads the tier's pages that continue a device hit. Needs the prefix cache.
    receives_copies: this pool's pages arrive by KV transfer (a decode instance): not new uses
    to the tier's admission."""
    if self.cache is None:
      raise ValueError("a host tier needs the prefix cache (page names)")
    cache = self.cache

    def on_drop(page: int, name: bytes, salt: str) -> None:
      if tier.admits(name, salt, cache.hits_of(page), cache.idle_since(page),
                     receives_copies):   # (admission)
        offload(page, name, salt)

    self.host, cache.on_drop = tier, on_drop

  def attach_audit(self, audit, instance: str, page_bytes: int) -> None:
    """Records this pool's KV events in the run's audit (kv/audit.py) under `instance`: its
    prefix cache's evictions, expiries and flushes, and its reloads from the host tier."""
    if self.cache is None:
      raise ValueError("a KV audit needs the prefix cache (only named pages have a lifecycle)")
    self.audit = lambda event, tier, salt, pages: audit.record(event, tier, instance, salt,
                                                               pages, page_bytes)
    self.cache.on_event = lambda event, salt, pages: self.audit(event, "device", salt, pages)

  def take_loads(self) -> list[tuple[int, object]]:
    """The host pages to write into this pool before the next step runs: (page, payload),
    for a caller that reads them now (the simulator, the engine's host copies): the tier
    pages they came from are released."""
    loads, release = self.take_loads_held()
    release()
    return loads

  def take_loads_held(self) -> tuple[list[tuple[int, object]], object]:
    """take_loads for a caller that reads the pages later (a Ray actor fetches them from the
    node store when its step runs): (loads, release), release() once they were read or never
    will be (idempotent); until then the tiers keep them (HostTier.pin)."""
    loads, self.pending_loads = list(self.pending_loads.items()), {}
    pins = [self._pins.pop(p) for p, _ in loads if p in self._pins]
    return loads, _Release(pins)

  def _unpin(self, pages) -> None:
    """Pending loads of these pages that will never be read (their sequence let them go)."""
    _Release([self._pins.pop(p) for p in pages if p in self._pins])()

  def _account(self, seq_id: str, num_tokens: int, owner: str = "") -> None:
    """Records a new or grown table: its tokens (never shrinking) and its owner's pages."""
    pages = len(self._tables[seq_id])
    old_pages, old_tokens, owner = self._held.get(seq_id, (0, 0, owner))
    tokens = max(num_tokens, old_tokens)
    self.num_unused_slots += (pages - old_pages) * self.page_size - (tokens - old_tokens)
    self._held[seq_id] = (pages, tokens, owner)
    if pages == old_pages and old_pages:   # a token more in a page it holds (most decode steps)
      return
    self.pages_by_owner[owner] += pages - old_pages
    if self.pages_by_owner[owner] > self.peak_pages_by_owner.get(owner, 0):
      self.peak_pages_by_owner[owner] = self.pages_by_owner[owner]

  def _unaccount(self, seq_id: str) -> None:
    pages, tokens, owner = self._held.pop(seq_id)
    self.num_unused_slots -= pages * self.page_size - tokens
    self.pages_by_owner[owner] -= pages

  def _make_room(self, n: int) -> None:
    """Evicts idle cached pages until n pages are free (when a cache is on)."""
    short = n - self.allocator.num_free
    if short > 0 and self.cache is not None:
      self.cache.evict(short)

  def pages_needed(self, num_tokens: int) -> int:
    if num_tokens < 0:
      raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // self.page_size)

  def can_allocate(self, num_tokens: int) -> bool:
    return 0 <= self.pages_needed(num_tokens) <= self.num_free_pages

  def allocate(self, seq_id: str, num_tokens: int, owner: str = "") -> list[int]:
    """Gives a new sequence enough pages for num_tokens; returns its block table."""
    if seq_id in self._tables:
      raise ValueError(f"sequence {seq_id} already has pages")
    self._make_room(self.pages_needed(num_tokens))
    pages = self.allocator.allocate(self.pages_needed(num_tokens))
    self._tables[seq_id] = pages
    self._account(seq_id, num_tokens, owner)
    return list(pages)

  def extend(self, seq_id: str, num_tokens: int) -> list[int]:
    """Grows seq_id's table to hold num_tokens; returns only the newly added pages."""
    table, held = self._tables.get(seq_id), self._held.get(seq_id)
    if (held is not None and table is not None and held[0] == len(table) and held[0]
        and 0 <= num_tokens <= held[0] * self.page_size):
      # Most decode steps: a token more in a page it holds (the general path below with no
      # page missing, and _account's first branch, inlined: the simulator calls this for
      # every sequence of every step).
      if num_tokens > held[1]:
        self.num_unused_slots -= num_tokens - held[1]
        self._held[seq_id] = (held[0], num_tokens, held[2])
      return []
    table = self._table(seq_id)
    missing = self.pages_needed(num_tokens) - len(table)
    if missing > 0:
      self._make_room(missing)
      new = self.allocator.allocate(missing)
      table.extend(new)
    else:
      new = []
    self._account(seq_id, num_tokens)
    return new

  def extend_each(self, seq_ids: list[str], lengths: list[int]) -> int:
    """extend(seq_ids[i], lengths[i]) for each i in order until one needs a page the pool
    cannot give (OutOfPages): returns how many were extended (len(seq_ids) for all)."""
    for i, (seq_id, num_tokens) in enumerate(zip(seq_ids, lengths)):
      try:
        self.extend(seq_id, num_tokens)
      except OutOfPages:
        return i
    return len(seq_ids)

  def extend_steps(self, seq_ids: list[str], lengths: list[int],
                   steps: int) -> tuple[list[int], list[int]]:
    """The same as `steps` rounds of `extend(seq_ids[i], lengths[i] + k)` (round k = 0, 1, ...;
    each round in the sequences' order), at once: the same pages to the same tables, the same
    accounting. Returns the pool's num_used_pages and num_unused_slots after each round. New
    pages come from the free list only: when they do not fit, raises OutOfPages before changing
    anything (never evicts cached pages). A simulated decode chain's page growth."""
    ps, held = self.page_size, [self._held[s] for s in seq_ids]
    grants = []                           # (round, sequence): a page more, in allocation order
    for i, ((pages, tokens, _), length) in enumerate(zip(held, lengths)):
      final = max(tokens, length + steps - 1)
      for page in range(pages, -(-final // ps)):   # its page-th page: once a round exceeds
        grants.append((max(page * ps - length + 1, 0), i))   # page * ps tokens
    if len(grants) > self.allocator.num_free:
      raise OutOfPages(f"need {len(grants)} pages, {self.allocator.num_free} free")
    grants.sort()
    added = [0] * steps
    for k, i in grants:
      self._tables[seq_ids[i]].extend(self.allocator.allocate(1))
      added[k] += 1
    offsets = [length - tokens for (_, tokens, _), length in zip(held, lengths)]
    if min(offsets) >= 0:                 # (tokens grow from round 0: the usual case)
      first, n = sum(offsets), len(offsets)
      grown = [first + n * k for k in range(steps)]
    else:
      grown = [sum(max(o + k, 0) for o in offsets) for k in range(steps)]
    used, unused, total = [], [], 0
    base_used, base_unused = self.num_used_pages - len(grants), self.num_unused_slots
    for more, tokens in zip(added, grown):
      total += more
      used.append(base_used + total)
      unused.append(base_unused + ps * total - tokens)
    for seq_id, (pages, tokens, owner), length in zip(seq_ids, held, lengths):
      now_pages = len(self._tables[seq_id])
      self._held[seq_id] = (now_pages, max(tokens, length + steps - 1), owner)
      if now_pages > pages:
        self.pages_by_owner[owner] += now_pages - pages
        if self.pages_by_owner[owner] > self.peak_pages_by_owner.get(owner, 0):
          self.peak_pages_by_owner[owner] = self.pages_by_owner[owner]
    self.num_unused_slots = unused[-1]
    return used, unused

  def allocate_prefix(self, seq_id: str, token_ids, num_tokens: int, salt: str,
                      now: float = 0.0, owner: str = "") -> int | None:
    """Like allocate, reusing the cached pages of token_ids' longest cached prefix (at least
    one token is always left to compute). Returns the number of cached tokens, or None (and
    allocates nothing) when the pages do not fit."""
    if self.cache is None:
      return 0 if self._allocate_or_none(seq_id, num_tokens, owner) else None
    if seq_id in self._tables:
      raise ValueError(f"sequence {seq_id} already has pages")
    self.cache.expire(now)
    max_pages = min((len(token_ids) - 1) // self.page_size, self.pages_needed(num_tokens))
    hits, names = self.cache.match(salt, token_ids, max_pages)
    need = self.pages_needed(num_tokens) - len(hits)
    if need > self.num_free_pages - self.cache.num_idle(hits):
      return None
    self.cache.acquire(hits)
    self._make_room(need)
    self._tables[seq_id] = hits + self.allocator.allocate(need)
    self._names[seq_id] = (names, salt)
    self._account(seq_id, num_tokens, owner)
    reloaded = 0
    if self.host is not None and len(hits) < max_pages:
      # The host tier continues the device hit (names chain: only a prefix can be reused).
      reloaded = self.host.ready_prefix(names[len(hits):], salt, now)
      fresh = self._tables[seq_id][len(hits):len(hits) + reloaded]
      taken = names[len(hits):len(hits) + reloaded]
      payloads = self.host.take(taken, salt, now)
      self.host.pin(taken)
      self.pending_loads.update(zip(fresh, payloads))
      self._pins.update((page, (self.host, name)) for page, name in zip(fresh, taken))
      if reloaded and self.audit is not None:
        self.audit("reload", "host", salt, reloaded)
      if self.remote is not None and len(hits) + reloaded < len(names):
        reloaded += self._reload_remote(seq_id, names, len(hits) + reloaded, salt, now,
                                        len(token_ids))
      self.host.count_lookup(reloaded)
    return (len(hits) + reloaded) * self.page_size

  def _reload_remote(self, seq_id: str, names: list[bytes], start: int, salt: str,
                     now: float, prompt_tokens: int) -> int:
    """The pages after `start` that another node's tier holds, taken when predicted faster
    than recomputing them (kv/remote_store.py). Returns how many."""
    peer, n = self.remote.find(names[start:], salt, now)
    if not n:
      return 0
    if not self.remote.worth(n, start * self.page_size, prompt_tokens):
      self.host.stats["remote_declined_pages"] += n
      return 0
    fresh = self._tables[seq_id][start:start + n]
    payloads = peer.take(names[start:start + n], salt, now)
    peer.pin(names[start:start + n])
    self.pending_loads.update(zip(fresh, [RemotePage(peer.node, p) for p in payloads]))
    self._pins.update((page, (peer, name)) for page, name in zip(fresh, names[start:start + n]))
    self.host.stats["remote_hit_pages"] += n
    if self.audit is not None:
      self.audit("reload", "remote", salt, n)
    return n

  def _allocate_or_none(self, seq_id: str, num_tokens: int, owner: str = "") -> bool:
    if not self.can_allocate(num_tokens):
      return False
    self.allocate(seq_id, num_tokens, owner)
    return True

  def cache_computed(self, seq_id: str, num_tokens: int, now: float = 0.0,
                     token_ids=None) -> int:
    """Names the full pages of seq_id's first num_tokens computed tokens in the cache (for a
    sequence allocate_prefix placed; token_ids renames them when the sequence grew past its
    prompt, e.g. with generated tokens). Returns pages added."""
    if self.cache is None or seq_id not in self._names:
      return 0
    names, salt = self._names[seq_id]
    if token_ids is not None:
      names = page_hashes(salt, token_ids, self.page_size,
                          min(len(token_ids), num_tokens) // self.page_size)
      self._names[seq_id] = (names, salt)
    k = min(num_tokens // self.page_size, len(names))
    return self.cache.insert(names[:k], self._table(seq_id)[:k], salt, now)

  def block_table(self, seq_id: str) -> list[int]:
    return list(self._table(seq_id))

  def tokens_of(self, seq_id: str) -> int:
    """The tokens seq_id's table holds (its longest allocation or extension)."""
    self._table(seq_id)
    return self._held[seq_id][1]

  def pages_of(self, seq_id: str) -> list[int]:
    """seq_id's block table itself, not a copy: for a caller that reads it at once and
    keeps nothing (the simulator's hot loop); it changes as the sequence grows."""
    return self._table(seq_id)

  def free(self, seq_id: str, now: float = 0.0) -> None:
    table = self._table(seq_id)
    self.allocator.free(table)
    self._unaccount(seq_id)
    del self._tables[seq_id]
    if self.pending_loads:
      for p in table:
        self.pending_loads.pop(p, None)  # never written into a page someone else gets next
      if self._pins:
        self._unpin(table)
    self._names.pop(seq_id, None)
    if self.cache is not None:
      self.cache.release(table, now)

  def reset(self, now: float = 0.0) -> int:
    """The device state is gone (a dead instance): every sequence's pages and every cached
    page return to the free list. Returns how many pages were in use or cached."""
    lost = self.allocator.num_used
    for seq_id in list(self._tables):
      self.free(seq_id, now)
    if self.cache is not None:
      self.cache.clear()                 # (not offloaded: the device state is gone)
    return lost

  def __contains__(self, seq_id: str) -> bool:
    return seq_id in self._tables

  def __len__(self) -> int:
    """Sequences holding pages."""
    return len(self._tables)

  @property
  def seq_ids(self) -> list[str]:
    return list(self._tables)

  @property
  def num_free_pages(self) -> int:
    """Free pages plus idle cached ones (evicted on demand)."""
    return self.allocator.num_free + (self.cache.num_evictable if self.cache else 0)

  @property
  def num_cached_idle_pages(self) -> int:
    """Cached pages no sequence uses (kept for future hits, evicted on demand)."""
    return self.cache.num_evictable if self.cache else 0

  @property
  def num_used_pages(self) -> int:
    """Pages some sequence holds (idle cached pages count as free)."""
    return self.allocator.num_pages - self.num_free_pages

  def leaked(self) -> int:
    """Used pages that no live block table (nor the prefix cache) references."""
    live = {p for table in self._tables.values() for p in table}
    if self.cache is not None:
      live |= self.cache.cached_pages()
    return sum(1 for p in range(self.allocator.num_pages)
               if not self.allocator.is_free(p) and p not in live)

  def check_invariants(self) -> None:
    """Raises AssertionError describing the first broken bookkeeping invariant."""
    alloc = self.allocator
    free = alloc.num_free
    used = sum(1 for rc in alloc._refcount if rc > 0)
    if free + used != alloc.num_pages:
      raise AssertionError(
          f"free ({free}) + used ({used}) != total ({alloc.num_pages})")
    holders = collections.Counter(p for t in self._tables.values() for p in t)
    if self.cache is not None:
      holders.update(self.cache.cached_pages())
    free_set = set(alloc._free)
    expected = [0] * alloc.num_pages   # (all well: one comparison; else the page at fault)
    for p, n in holders.items():
      if 0 <= p < alloc.num_pages:
        expected[p] = n
    well = (expected == alloc._refcount and free_set.isdisjoint(holders)
            and all(0 <= p < alloc.num_pages for p in holders))
    for p in () if well else range(alloc.num_pages):
      rc, n = alloc.refcount(p), holders.get(p, 0)
      if n and (rc == 0 or p in free_set):
        raise AssertionError(f"free page {p} is reachable from a live block table")
      if n >= 2 and rc < 2:
        raise AssertionError(f"page {p} owned {n} times with refcount {rc}")
      if rc != n:
        raise AssertionError(f"page {p} has refcount {rc} but {n} live holders")
    if self.cache is not None:
      idle = set(self.cache._idle)
      wrong = [p for p in self.cache.cached_pages() if (alloc.refcount(p) == 1) != (p in idle)]
      if wrong:
        raise AssertionError(f"cached page {wrong[0]} is evictable iff unused: broken")
    if any(self._held.get(seq, (None,))[0] != len(t) for seq, t in self._tables.items()) \
        or set(self._held) != set(self._tables):
      raise AssertionError("per-sequence page accounting differs from the block tables")
    held = {seq: (len(t), self._held[seq][1]) for seq, t in self._tables.items()}
    unused = sum(n * self.page_size - tokens for n, tokens in held.values())
    if unused != self.num_unused_slots:
      raise AssertionError(f"unused slots {self.num_unused_slots} != {unused} recounted")
    if sum(self.pages_by_owner.values()) != sum(n for n, _ in held.values()):
      raise AssertionError("pages per owner do not add up to the block tables' pages")
    num_refcounted_free = sum(1 for p in alloc._free if alloc._refcount[p] != 0)
    if num_refcounted_free:
      raise AssertionError(
          f"{num_refcounted_free} pages on the free list have a nonzero refcount")

  def _table(self, seq_id: str) -> list[int]:
    if seq_id not in self._tables:
      raise ValueError(f"unknown sequence {seq_id}")
    return self._tables[seq_id]
