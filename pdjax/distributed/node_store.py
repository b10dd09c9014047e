"""A node's KV store under the Ray launcher (issue 32): the bytes of the host tier's pages, in
one actor per node that every instance process of the node writes to and reads from. The
tier's bookkeeping (names, salts, landing, admission, eviction, tenants) stays in the driver's
`HostTier`; the store only holds `name -> page` ([2, layers, kv_heads, page_size, head_dim]
arrays, host memory) and drops what the tier forgets.

Sealed at rest (kv.seal_cross_node): when the run has a seal key, the instance that writes a
page seals it under its name first (distributed/sealed_kv.py), so the store holds SealedPages
only, never a plaintext page and never the key; every reader, on its node or another, opens
what it reads (actor.py's `_read_sealed`). Neither the store's memory nor an object of it that
Ray spills to disk holds KV in the clear. Without a key the store holds the arrays.

An actor rather than pages in Ray's object store: measured on the 2-core CPU
(benchmarks/kv_store_ray.py, BENCHMARKS.md), writing 64 pages of 2 MiB took 0.49 s through the
actor against 1.1 s as actor-call return objects (`ray.put(_owner=...)`, which would have
let the store own objects put by an instance, was removed in Ray 2.56), reads 0.37 s against
0.06 s; and objects returned by an instance's call belong to the caller, so a dead store could
not be told from a dead driver. A killed store actor is a lost tier (HostTier.lose): the calls
that reach it fail and the driver stops offering and reading.

Large pages (>= LARGE_PAGE_BYTES) are kept as objects the store itself `ray.put`s (it owns
them: they die with it) and handed out as refs, which the reader fetches from the object
store: measured idle, 64 pages of 2 MiB read in 8.7 ms that way against 71 ms returned by the
actor, written in 129 against 71 ms; 256 pages of 16 KiB would write 20x slower as objects,
so small pages stay in the actor (a sealed page counts its ciphertext's bytes). `get` returns
pages and refs mixed (`fetch_pages`).
"""

from __future__ import annotations

import asyncio

LARGE_PAGE_BYTES = 1 << 20
STORE_TIMEOUT_S = 120.0   # the longest an instance or the driver waits for a store call: then
                          # the store counts as lost (its tier is), as a dead one


class NodeStore:

  def __init__(self, large_page_bytes: int = LARGE_PAGE_BYTES):
    self.pages: dict[bytes, object] = {}   # name -> page (array or SealedPage), or the ref
                                           # of its object
    self.large_page_bytes = large_page_bytes
    self._tampered_reads = 0               # (tamper_sealed_reads)

  def put(self, items: dict) -> int:
    """Stores pages (arrays, or SealedPages when the run seals) by name; returns their
    bytes."""
    import ray
    self.pages.update({n: ray.put(a) if a.nbytes >= self.large_page_bytes else a
                       for n, a in items.items()})
    return sum(int(a.nbytes) for a in items.values())

  def get(self, names: list[bytes]) -> list:
    """The pages as stored: arrays or SealedPages, or refs of large pages' objects
    (`fetch_pages` resolves them). A read under `tamper_sealed_reads` has its first piece
    tampered (and handed out inline)."""
    got = [self.pages[n] for n in names]
    if self._tampered_reads > 0 and got:
      import ray
      from pdjax.distributed.sealed_kv import tampered
      from pdjax.kv.seal import SealedPage
      first = ray.get(got[0]) if isinstance(got[0], ray.ObjectRef) else got[0]
      if isinstance(first, SealedPage):
        self._tampered_reads -= 1
        got[0] = tampered(first)
    return got

  def tamper_sealed_reads(self, n: int) -> None:
    """Fault injection: the next n reads of sealed pages flip a byte of their first piece (a
    read corrupted on its way, as faults.tamper_prob does to P -> D pieces)."""
    self._tampered_reads = n

  def drop(self, names: list[bytes]) -> int:
    return sum(self.pages.pop(n, None) is not None for n in names)

  def clear(self) -> int:
    n = len(self.pages)
    self.pages.clear()
    return n

  def held(self) -> int:
    return len(self.pages)


async def fetch_pages(got: list) -> list:
  """A store's `get` result as pages (arrays or SealedPages): large pages' objects fetched
  from the object store."""
  import ray
  refs = [g for g in got if isinstance(g, ray.ObjectRef)]
  if not refs:
    return got
  arrays = iter(await asyncio.gather(*refs))
  return [next(arrays) if isinstance(g, ray.ObjectRef) else g for g in got]
