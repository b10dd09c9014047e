"""The driver's running counters: numbers a server exposes as Prometheus counters, counted at
the moment they happen so they never decrease and a scrape costs O(instances), whatever the
run's length. Pure Python.

  prefix_queries[instance] / prefix_hits[instance]: prompt tokens looked up in / served from
      an instance's prefix cache, at each first prefill's page allocation there (a request
      recomputed elsewhere after its instance died adds a lookup on the new instance; the
      old instance keeps what it counted);
  fallbacks[kind]: requests that took a fallback of that kind (once per request and kind, as
      summary.json's faults.fell_back).
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class Tally:
  prefix_queries: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  prefix_hits: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def prefix_lookup(self, instance: str, queried: int, hit: int) -> None:
    self.prefix_queries[instance] += queried
    self.prefix_hits[instance] += hit

  def fallback(self, kind: str, taken_before: list[str]) -> None:
    """A request takes fallback `kind`; taken_before: its fallbacks until now."""
    if kind not in taken_before:
      self.fallbacks[kind] += 1

  def snapshot(self) -> "Tally":
    """A copy another thread may read while the driver goes on counting."""
    return Tally(collections.Counter(self.prefix_queries), collections.Counter(self.prefix_hits),
                 collections.Counter(self.fallbacks))
