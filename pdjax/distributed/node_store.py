"""A node's KV store under the Ray launcher (issue 32): the bytes of the host tier's pages, in
one actor per node that every instance process of the node writes to and reads from. The
tier's bookkeeping (names, salts, landing, admission, eviction, tenants) stays in the driver's
`HostTier`; the store only holds `name -> page` arrays ([2, layers, kv_heads, page_size,
head_dim], host memory) and drops what the tier forgets.

An actor rather than pages in Ray's object store: measured on the 2-core CPU
(benchmarks/kv_store_ray.py, BENCHMARKS.md), writing 64 pages of 2 MiB took 0.49 s through the
actor against 1.1 s as actor-call return objects (`ray.put(_owner=...)`, which would have
let the store own objects put by an instance, was removed in Ray 2.56), reads 0.37 s against
0.06 s; and objects returned by an instance's call belong to the caller, so a dead store could
not be told from a dead driver. A killed store actor is a lost tier (HostTier.lose): the calls
that reach it fail and the driver stops offering and reading.
"""

from __future__ import annotations


class NodeStore:

  def __init__(self):
    self.pages: dict[bytes, object] = {}

  def put(self, items: dict) -> int:
    """Stores pages by name; returns their bytes."""
    self.pages.update(items)
    return sum(int(a.nbytes) for a in items.values())

  def get(self, names: list[bytes]) -> list:
    return [self.pages[n] for n in names]

  def get_sealed(self, names: list[bytes], key: bytes) -> list:
    """The pages sealed under their names (kv.seal_cross_node: a read from another node)."""
    from pdjax.distributed.sealed_kv import seal_pages
    return seal_pages(key, names, [self.pages[n] for n in names])

  def drop(self, names: list[bytes]) -> int:
    return sum(self.pages.pop(n, None) is not None for n in names)

  def clear(self) -> int:
    n = len(self.pages)
    self.pages.clear()
    return n

  def held(self) -> int:
    return len(self.pages)
