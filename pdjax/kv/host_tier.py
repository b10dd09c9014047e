"""A node's host-memory KV tier: full prefix pages offloaded from the instances' device pools,
kept under the same names as the device prefix cache (pure Python, deterministic).

A page's name is the prefix cache's chained hash over (salt, previous page, tokens), the salt
being the tenant's own unless a shared salt is configured: a lookup under one tenant's salt can
only reach pages written under it. Each entry holds a `payload` that the tier never looks into
(the simulator's page digest, the engine's host copy of the page's K/V).

A write (offload) is in flight until `ready_s`: a page is never served before its copy has
landed, and a writer that dies before then loses its writes (`drop_writer`), so nothing is
ever read half-written. Landed pages are evicted least recently used first (`lfu`: fewest
hits first, ties by recency) when the tier is full; pages still being written are never
evicted, and a write that finds the tier full of them is refused (counted).

A page taken for a reload (`take`) is pinned (`pin`) until its reader `release`s it (the
reload read its bytes, or never will): a later admission of the same plan cannot evict it,
and a flush that forgets it (nothing finds it from then on) leaves its bytes to the reader:
`on_forget` hears of it once the last reader let go. Under Ray the bytes sit in the node's
store and are read by the instance's process when its step runs, after the driver planned
the step.

Which evicted pages are offered at all is the tier's `admission` (kv/offload_admission.py:
every page, pages reused on the device, or a decaying frequency filter), asked before any copy.

Offload (the prefix cache's on_drop), reloads (BlockTables.allocate_prefix / pending_loads),
the routers' view (InstanceQueue.prefix_credit) and the write-through hand-off build on it.
"""

from __future__ import annotations

import collections
import dataclasses

from pdjax.kv.offload_admission import AllPages
from pdjax.kv.prefix_cache import under_salt

HOST_TIER_POLICIES = ("lru", "lfu")


@dataclasses.dataclass
class HostPage:
  salt: str
  owner: str            # tenant, for per-tenant accounting
  payload: object
  writer: str           # the instance that offloaded it
  ready_s: float        # its copy has landed from then on
  last_used_s: float
  hits: int = 0


class HostTier:

  def __init__(self, capacity_pages: int, policy: str = "lru", admission=None, node: int = 0):
    if capacity_pages < 1:
      raise ValueError(f"capacity_pages must be >= 1, got {capacity_pages}")
    if policy not in HOST_TIER_POLICIES:
      raise ValueError(f"policy must be one of {HOST_TIER_POLICIES}, got {policy!r}")
    self.capacity, self.policy, self.node = capacity_pages, policy, node   # (cluster.nodes)
    self.admission = admission or AllPages()
    self.audit, self.page_bytes = None, 0   # the run's KvAudit (attach_audit)
    self.on_forget = None   # called with the names whose payloads the tier let go (evicted,
                            # flushed, lost): a node store outside the process drops them
    self.lost = False       # its store died (lose): nothing is offered or read any more
    self._pins: collections.Counter[bytes] = collections.Counter()   # name -> reads taken,
                                                                     # not yet released
    self._unheld: set[bytes] = set()   # forgotten while pinned: on_forget once released
    self._pages: collections.OrderedDict[bytes, HostPage] = collections.OrderedDict()  # LRU
    self.stats = collections.Counter()   # offloaded, refused, duplicates, hit_pages,
                                         # lookups, hit_lookups, evictions, flushed, aborted,
                                         # not_admitted, remote_hit_pages (read from
                                         # another node's tier), remote_declined_pages,
                                         # lost, discarded (did not read back: `discard`)

  def __len__(self) -> int:
    return len(self._pages)

  def __contains__(self, name: bytes) -> bool:
    return name in self._pages

  def attach_audit(self, audit, page_bytes: int) -> None:
    """Records the tier's offloads, evictions and flushes in the run's audit (kv/audit.py)."""
    self.audit, self.page_bytes = audit, page_bytes

  def _record(self, event: str, instance: str, salt: str, pages: int) -> None:
    if self.audit is not None:
      self.audit.record(event, "host", instance, salt, pages, self.page_bytes)

  # ---- writes ---------------------------------------------------------------------------

  def admits(self, name: bytes, salt: str, hits: int, last_used_s: float,
             copy: bool = False) -> bool:
    """Whether an evicted device page (hit `hits` times while cached, last used then; copy:
    it arrived by KV transfer) is worth offloading: the admission policy's call, counted
    when it says no."""
    if self.admission.admit(name, salt, hits, last_used_s, copy):
      return True
    self.stats["not_admitted"] += 1
    return False

  def offer(self, name: bytes, salt: str, owner: str, payload, *, writer: str,
            ready_s: float, now: float) -> bool:
    """Stores an offloaded page (landing at ready_s); False when it is already held (same
    name, same content) or the tier is full of pages still being written."""
    if self.lost:
      return False
    if name in self._pages:
      self.stats["duplicates"] += 1
      return False
    if len(self._pages) >= self.capacity and not self._evict_one(now):
      self.stats["refused"] += 1
      return False
    self._unheld.discard(name)   # (written again: the store keeps it after the pinned read)
    self._pages[name] = HostPage(salt, owner, payload, writer, ready_s, now)
    self.stats["offloaded"] += 1
    self._record("offload", writer, salt, 1)
    return True

  def land(self, names: list[bytes], writer: str, now: float) -> int:
    """writer's copies of these names reached the store (a store outside the process, whose
    writes are offered with ready_s=inf): readable from now. Returns how many."""
    n = 0
    for name in names:
      page = self._pages.get(name)
      if page is not None and page.writer == writer and page.ready_s > now:
        page.ready_s, n = now, n + 1
    return n

  def in_flight(self, name: bytes, writer: str, now: float) -> bool:
    """Whether name is held as writer's write that has not landed by now (still to copy)."""
    page = self._pages.get(name)
    return page is not None and page.writer == writer and page.ready_s > now

  def drop_writer(self, writer: str, now: float) -> int:
    """writer died: its writes that had not landed by now are gone. Returns how many."""
    lost = [n for n, p in self._pages.items() if p.writer == writer and p.ready_s > now]
    for n in lost:
      del self._pages[n]
    self.stats["aborted"] += len(lost)
    self._forget(lost)
    return len(lost)

  def lose(self) -> int:
    """The store holding the pages died or stopped answering: the tier is gone for the rest
    of the run (requests recompute what it held), and a store still alive is told to drop
    everything. Returns the pages lost."""
    n, held = len(self._pages), list(self._pages) + sorted(self._unheld)
    self._pages.clear()
    self._pins.clear()
    self._unheld.clear()
    self.lost = True
    self.stats["lost"] += n
    self._forget(held)
    return n

  def discard(self, names: list[bytes]) -> int:
    """Forgets these pages (their bytes did not read back: a sealed page that did not open),
    so no later lookup finds them; the store drops them (once no reader holds them). Returns
    how many were held."""
    gone = [n for n in dict.fromkeys(names) if n in self._pages]
    for n in gone:
      del self._pages[n]
    self.stats["discarded"] += len(gone)
    self._forget(gone)
    return len(gone)

  def _forget(self, names: list[bytes]) -> None:
    """The payloads of these names are let go (on_forget), those pinned once released."""
    if self._pins:
      pinned = [n for n in names if n in self._pins]
      if pinned:
        self._unheld.update(pinned)
        names = [n for n in names if n not in self._pins]
    if names and self.on_forget is not None:
      self.on_forget(names)

  def flush(self, salt: str) -> int:
    """Forgets every page written under salt or its cache_salt narrowings (landed or not).
    Returns how many."""
    gone = [n for n, p in self._pages.items() if under_salt(p.salt, salt)]
    for n in gone:
      del self._pages[n]
    self.stats["flushed"] += len(gone)
    self._record("flush", "", salt, len(gone))
    self._forget(gone)
    return len(gone)

  # ---- reads ----------------------------------------------------------------------------

  def ready_prefix(self, names: list[bytes], salt: str, now: float) -> int:
    """How many of these leading names are held under salt and landed by now (a prefix: it
    stops at the first miss)."""
    n = 0
    for name in names:
      page = self._pages.get(name)
      if page is None or page.salt != salt or page.ready_s > now:
        break
      n += 1
    return n

  def held_prefix(self, names: list[bytes], salt: str) -> int:
    """Like ready_prefix, counting pages still being written (a routing signal: they land
    soon)."""
    return self.ready_prefix(names, salt, float("inf"))

  def take(self, names: list[bytes], salt: str, now: float) -> list:
    """The payloads of these names (all landed, under salt: check with ready_prefix first),
    counted as hits and made most recently used. A reader that reads them later `pin`s them
    until then."""
    out = []
    for name in names:
      page = self._pages[name]
      if page.salt != salt or page.ready_s > now:
        raise KeyError(f"host page {name.hex()} is not readable under {salt!r} at {now}")
      page.hits += 1
      page.last_used_s = now
      self._pages.move_to_end(name)
      out.append(page.payload)
    self.stats["hit_pages"] += len(out)
    if out:
      self.admission.reloaded(salt, len(out))
    return out

  def pin(self, names: list[bytes]) -> None:
    """A reader will read these held names (taken for a reload): never evicted until it
    `release`s them, their bytes kept until then should the tier forget them."""
    self._pins.update(names)

  def release(self, names: list[bytes]) -> None:
    """One reader of each of these taken names is done with it (read, or never will be):
    evictable again once no reader holds it; dropped from the store if it was forgotten
    meanwhile."""
    done = []
    for name in names:
      left = self._pins[name] - 1
      if left > 0:
        self._pins[name] = left
        continue
      self._pins.pop(name, None)   # (a lost tier's pins are gone already)
      if name in self._unheld:
        self._unheld.discard(name)
        done.append(name)
    if done and self.on_forget is not None:
      self.on_forget(done)

  def pinned(self) -> int:
    """Pages some reader has taken and not released."""
    return len(self._pins)

  def count_lookup(self, hit_pages: int) -> None:
    """One request's lookup (a hit when it found at least one page)."""
    self.stats["lookups"] += 1
    self.stats["hit_lookups"] += hit_pages > 0

  def pages_by_owner(self) -> dict[str, int]:
    return dict(sorted(collections.Counter(p.owner for p in self._pages.values()).items()))

  # ---- space ----------------------------------------------------------------------------

  def _evict_one(self, now: float) -> bool:
    pins = self._pins
    landed = ((n, p) for n, p in self._pages.items()   # LRU first; never a page being read
              if p.ready_s <= now and n not in pins)
    if self.policy == "lfu":   # fewest hits; min() keeps the least recently used of ties
      victim = min(landed, key=lambda item: item[1].hits, default=(None,))[0]
    else:
      victim = next(landed, (None,))[0]
    if victim is None:
      return False
    self._record("evict", "", self._pages.pop(victim).salt, 1)
    self.stats["evictions"] += 1
    self._forget([victim])
    return True
