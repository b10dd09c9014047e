"""Host-side paged KV bookkeeping: a page allocator with refcounts and block tables.

The device holds the KV cache as a pool of fixed-size pages; this module decides which
pages each sequence owns. Pure Python (no jax), deterministic (lowest free page first),
so schedulers and tests can reason about exact page lists.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Iterable


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


class BlockTables:
  """Sequence id -> list of pages (its block table), backed by a PageAllocator."""

  def __init__(self, num_pages: int, page_size: int):
    if page_size < 1:
      raise ValueError(f"page_size must be >= 1, got {page_size}")
    self.page_size = page_size
    self.allocator = PageAllocator(num_pages)
    self._tables: dict[str, list[int]] = {}

  def pages_needed(self, num_tokens: int) -> int:
    if num_tokens < 0:
      raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // self.page_size)

  def can_allocate(self, num_tokens: int) -> bool:
    return self.allocator.can_allocate(self.pages_needed(num_tokens))

  def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
    """Gives a new sequence enough pages for num_tokens; returns its block table."""
    if seq_id in self._tables:
      raise ValueError(f"sequence {seq_id} already has pages")
    pages = self.allocator.allocate(self.pages_needed(num_tokens))
    self._tables[seq_id] = pages
    return list(pages)

  def extend(self, seq_id: str, num_tokens: int) -> list[int]:
    """Grows seq_id's table to hold num_tokens; returns only the newly added pages."""
    table = self._table(seq_id)
    missing = self.pages_needed(num_tokens) - len(table)
    if missing <= 0:
      return []
    new = self.allocator.allocate(missing)
    table.extend(new)
    return new

  def block_table(self, seq_id: str) -> list[int]:
    return list(self._table(seq_id))

  def free(self, seq_id: str) -> None:
    table = self._table(seq_id)
    self.allocator.free(table)
    del self._tables[seq_id]

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
    return self.allocator.num_free

  @property
  def num_used_pages(self) -> int:
    return self.allocator.num_used

  def leaked(self) -> int:
    """Used pages that no live block table references."""
    live = {p for table in self._tables.values() for p in table}
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
    free_set = set(alloc._free)
    for p in range(alloc.num_pages):
      rc, n = alloc.refcount(p), holders.get(p, 0)
      if n and (rc == 0 or p in free_set):
        raise AssertionError(f"free page {p} is reachable from a live block table")
      if n >= 2 and rc < 2:
        raise AssertionError(f"page {p} owned {n} times with refcount {rc}")
      if rc != n:
        raise AssertionError(f"page {p} has refcount {rc} but {n} live holders")
    num_refcounted_free = sum(1 for p in alloc._free if alloc._refcount[p] != 0)
    if num_refcounted_free:
      raise AssertionError(
          f"{num_refcounted_free} pages on the free list have a nonzero refcount")

  def _table(self, seq_id: str) -> list[int]:
    if seq_id not in self._tables:
      raise ValueError(f"unknown sequence {seq_id}")
    return self._tables[seq_id]
