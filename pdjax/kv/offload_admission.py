"""Which evicted prefix pages a node's host tier takes (`kv.host_tier_admission`). Pure Python.

Offloading every evicted page writes the host link and the tier full of pages nobody asks for
again: in the short-request and cache-miss floods, 120-220 GiB were written for 1.5-5% read
back; vLLM's offloading connector measured about zero host hits the same way. The systems
users run filter first:

  all        every evicted page (what pdjax did before this policy existed)
  reused     a page hit at least once on the device while it was cached there (SGLang
             HiCache's write_through_selective, with a threshold of one hit)
  frequency  a decaying use count per page name, node-wide, as Dynamo's KVBM filters: a page
             starts at 1 when first computed, doubles on each device hit and each time it is
             computed again after an eviction, and halves at every multiple of `half_life_s`
             (on the run's clock) that passed between two of its uses; it is offloaded when
             its count reaches 2. So a page used twice within one period is kept (hit once,
             or recomputed once), a page seen once is not, and a hot page (hit often:
             doubled often) stays eligible for several periods after its last use. A copy
             that arrived by KV transfer (a decode instance's) is not a new use: only its
             hits count (and an unused copy dropped before its source leaves no count).
  adaptive   per tenant (page salt), from what the tier gave back: while the tenant's pages
             reloaded from the tier are at least `min_ratio` (0.1) of its pages offloaded
             (both halved whenever the offloads pass `window`, so old history fades), every
             evicted page of it is taken, as `all`; below that, only what `frequency` takes.
             A tenant starts as `all` for its first `probation` (256) offloads. The floods
             behind this (experiments/floods/README.md): page history alone cannot tell a
             document evicted before its first repeat (worth keeping) from a one-off prompt
             (not), but a tenant's reloads can.

The decision is made when the device prefix cache drops the page (PrefixCache.on_drop), from
the hits it had while cached and when it was last used; nothing is copied for a page refused.
The frequency counts of pages no longer on a device are kept for the `memory` most recently
dropped names (older ones start over at 1).
"""

from __future__ import annotations

import collections
import math

HOST_TIER_ADMISSIONS = ("all", "reused", "frequency", "adaptive")
THRESHOLD = 2.0
LOG2_THRESHOLD = 1   # (log2 of THRESHOLD: counts are powers of two)


class AllPages:
  name = "all"

  def admit(self, name: bytes, salt: str, hits: int, last_used_s: float,
            copy: bool = False) -> bool:
    return True

  def reloaded(self, salt: str, pages: int) -> None:
    """pages of salt's were read back from the tier (the adaptive policy's signal)."""


class ReusedPages(AllPages):
  name = "reused"

  def admit(self, name: bytes, salt: str, hits: int, last_used_s: float,
            copy: bool = False) -> bool:
    return hits >= 1


class FrequencyFilter(AllPages):
  name = "frequency"

  def __init__(self, half_life_s: float, memory: int):
    if half_life_s <= 0 or memory < 1:
      raise ValueError(f"frequency filter: half_life_s {half_life_s} must be > 0 and memory "
                       f"{memory} >= 1")
    self.half_life_s, self.memory = half_life_s, memory
    # name -> (log2 of its count, when), least recently dropped first. Every step of a count
    # is a doubling or a halving, so it is a power of two kept as its (integer) exponent:
    # exact, and never out of range (2.0 ** 1024, a page hit 1,024 times, overflowed).
    self._seen: collections.OrderedDict[bytes, tuple[int, float]] = collections.OrderedDict()

  def log2_count(self, name: bytes, hits: int, last_used_s: float, copy: bool = False) -> int:
    """log2 of the page's count when last used: its earlier count, halved per period boundary
    passed since, doubled (it was computed again; not for a copy); or 1 when first seen.
    Doubled per hit since."""
    earlier = self._seen.get(name)
    if earlier is None:
      base = 0
    else:
      log2, when = earlier
      periods = int(last_used_s // self.half_life_s) - int(when // self.half_life_s)
      base = (0 if copy else 1) + log2 - max(periods, 0)
    return base + hits

  def count(self, name: bytes, hits: int, last_used_s: float, copy: bool = False) -> float:
    """The count itself (log2_count's power of two; inf past a float's range)."""
    log2 = self.log2_count(name, hits, last_used_s, copy)
    return math.ldexp(1.0, log2) if log2 < 1024 else math.inf

  def admit(self, name: bytes, salt: str, hits: int, last_used_s: float,
            copy: bool = False) -> bool:
    if copy and hits == 0 and name not in self._seen:
      return False      # an unused copy dropped before its source: no use to remember
    log2 = self.log2_count(name, hits, last_used_s, copy)
    self._seen[name] = (log2, last_used_s)
    self._seen.move_to_end(name)
    while len(self._seen) > self.memory:
      self._seen.popitem(last=False)
    return log2 >= LOG2_THRESHOLD


class AdaptiveAdmission(AllPages):
  name = "adaptive"

  def __init__(self, frequency: FrequencyFilter, min_ratio: float = 0.1, probation: int = 256,
               window: int = 4096, max_tenants: int = 4096):
    self.frequency, self.min_ratio = frequency, min_ratio
    self.probation, self.window, self.max_tenants = probation, window, max_tenants
    # salt -> [offloaded, reloaded] (decayed), least recently touched first: a long-lived
    # server with a cache_salt per conversation would otherwise keep one entry per salt
    self._tenants: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

  def _counts(self, salt: str) -> list[float]:
    counts = self._tenants.setdefault(salt, [0.0, 0.0])
    self._tenants.move_to_end(salt)
    while len(self._tenants) > self.max_tenants:   # (forgotten: on probation again)
      self._tenants.popitem(last=False)
    return counts

  def pays_off(self, salt: str) -> bool:
    """Whether salt's pages are worth offloading whole: on probation, or reloaded enough."""
    offloaded, reloaded = self._tenants.get(salt, (0.0, 0.0))
    return offloaded < self.probation or reloaded >= self.min_ratio * offloaded

  def admit(self, name: bytes, salt: str, hits: int, last_used_s: float,
            copy: bool = False) -> bool:
    frequent = self.frequency.admit(name, salt, hits, last_used_s, copy)   # (its memory)
    taken = self.pays_off(salt) or frequent
    if taken:
      counts = self._counts(salt)
      counts[0] += 1
      if counts[0] > self.window:
        counts[0], counts[1] = counts[0] / 2, counts[1] / 2
    return taken

  def reloaded(self, salt: str, pages: int) -> None:
    self._counts(salt)[1] += pages


def make_admission(name: str, *, half_life_s: float = 60.0, memory: int = 1 << 16):
  if name == "all":
    return AllPages()
  if name == "reused":
    return ReusedPages()
  if name == "frequency":
    return FrequencyFilter(half_life_s, memory)
  if name == "adaptive":
    return AdaptiveAdmission(FrequencyFilter(half_life_s, memory))
  raise ValueError(f"host tier admission {name!r} is not one of "
                   f"{', '.join(HOST_TIER_ADMISSIONS)}")
