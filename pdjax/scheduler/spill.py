"""An append-only list whose older items live in a file, so a server that runs for days keeps
its run's records (the driver's steps, state samples and transfers; its finished requests)
without its memory growing with them. Pure Python.

At most 2 * keep items stay in memory (the newest `keep` always do: the driver may still
change its latest sample); older ones are pickled to `path` in batches. Reading back is exact
(the same dicts and Requests): iterating yields every item in order, reading the spilled
batches one at a time; `since(n)` starts at item n and reads only the batches it needs, so a
reader that follows the list (the /metrics transfer histograms) pays for what is new, not for
the run's length. Indexing reaches any item (a spilled one costs a batch read).
Single-threaded, like the driver that appends to it.
"""

from __future__ import annotations

import bisect
import itertools
import os
import pickle
from collections.abc import Iterator

KEEP = 512


class SpilledList:

  def __init__(self, path: str, keep: int = KEEP):
    if keep < 1:
      raise ValueError(f"keep must be at least 1, got {keep}")
    self.path, self.keep = path, keep
    self._tail: list = []
    self._firsts: list[int] = []      # index of each spilled batch's first item
    self._offsets: list[int] = []     # and its byte offset in the file
    self._spilled = 0
    self._file = None

  def append(self, item) -> None:
    self._tail.append(item)
    if len(self._tail) >= 2 * self.keep:
      self._spill(len(self._tail) - self.keep)

  def _spill(self, n: int) -> None:
    if self._file is None:
      self._file = open(self.path, "wb")   # pylint: disable=consider-using-with  (see close)
    self._firsts.append(self._spilled)
    self._offsets.append(self._file.tell())
    pickle.dump(self._tail[:n], self._file, protocol=pickle.HIGHEST_PROTOCOL)
    self._file.flush()
    del self._tail[:n]
    self._spilled += n

  def __len__(self) -> int:
    return self._spilled + len(self._tail)

  def __bool__(self) -> bool:
    return len(self) > 0

  def __iter__(self) -> Iterator:
    return self.since(0)

  def since(self, n: int) -> Iterator:
    """The items from index n on, in order."""
    n = max(n, 0)
    if n < self._spilled:
      spilled, tail = self._spilled, list(self._tail)   # as of now
      with open(self.path, "rb") as f:
        for b in range(bisect.bisect_right(self._firsts, n) - 1, len(self._firsts)):
          first = self._firsts[b]
          if first >= spilled:
            break
          f.seek(self._offsets[b])
          batch = pickle.load(f)
          yield from batch[max(n - first, 0):]
      yield from tail
      return
    yield from self._tail[n - self._spilled:]

  def __getitem__(self, i):
    if isinstance(i, slice):
      start, stop, step = i.indices(len(self))
      return list(itertools.islice(self.since(start), 0, max(stop - start, 0), step))
    if i < 0:
      i += len(self)
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for {len(self)} items")
    if i >= self._spilled:
      return self._tail[i - self._spilled]
    return next(self.since(i))

  def close(self) -> None:
    """Deletes the spill file (the items it held are gone)."""
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._spilled and os.path.exists(self.path):
      os.remove(self.path)
    self._tail, self._firsts, self._offsets, self._spilled = [], [], [], 0
