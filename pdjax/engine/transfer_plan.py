"""Which pages a KV transfer of k pages moves, in which pieces, through which programs.

One gather program on the source and one scatter program on the destination per transfer,
compiled ahead of time per transfer bucket b (the powers of two, then pages_per_seq), with
exactly the bytes of k pages moved between them. Static shapes cannot make a program's output
k pages for every k, so bucket b's programs, which serve every k from b up to the next bucket,
work on fixed *slots* of page ids (`slot_sizes`): b itself, then pieces whose subset sums
cover 1..next - 1 - b (8: 8 | 4 2 1; 32 with 40 next: 32 | 4 2 1; the largest bucket: itself).
A transfer of k pages fills slot 0 and the slots summing to k - b (`transfer_plan`:
37 -> 32 + 4 + 1; 64 -> 64, one piece). Only the filled slots are copied; an empty slot's
source ids are negative and its destination ids out of range, so the gather program outputs
zeros for it instead of gathering, and the scatter program skips it (a `lax.cond` on the
slot's first id), taking a blank of the same size, never read, in its place. Why b itself is a slot: a transfer of a bucket's
size (the common whole-prompt case) moves as one array per destination device, and each array
costs the copy and the destination's assembly a fixed overhead.

Pure Python and numpy: the bookkeeping both sides of a transfer, in one process or two, agree on.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


def _cover(rest: int) -> list[int]:
  """Sizes summing to rest whose subset sums are every count 0..rest: powers of two 1, 2, 4,
  ... while they fit, then what is left (largest first)."""
  cover, power = [], 1
  while sum(cover) + power <= rest:
    cover.append(power)
    power *= 2
  if rest - sum(cover):
    cover.append(rest - sum(cover))
  return sorted(cover, reverse=True)


def slot_sizes(buckets: tuple[int, ...], b: int) -> tuple[int, ...]:
  """The slots of bucket b's programs, which move every count k from b up to the next bucket
  (exclusive): b itself, then a cover of the counts 1..next - 1 - b; the largest bucket
  (pages_per_seq) moves only itself."""
  i = buckets.index(b)
  if i == len(buckets) - 1:
    return (b,)
  return (b,) + tuple(_cover(buckets[i + 1] - 1 - b))


@dataclasses.dataclass(frozen=True)
class Plan:
  """How k pages travel: the bucket whose programs move them, its slots, the slots filled
  (indices, ascending) and where page i of the transfer sits among the bucket's page ids."""
  k: int
  bucket: int
  slots: tuple[int, ...]
  used: tuple[int, ...]
  positions: np.ndarray      # [k] int32: page i's index into the bucket's page ids

  @property
  def width(self) -> int:
    """How many page ids the bucket's programs take (all its slots)."""
    return sum(self.slots)

  @property
  def pieces(self) -> list[int]:
    """The sizes of the pieces that travel, summing to k."""
    return [self.slots[i] for i in self.used]

  def ids(self, pages, fill: int) -> np.ndarray:
    """The bucket's page ids (`width` of them): pages in the filled slots, `fill` in the
    others."""
    out = np.full(self.width, fill, np.int32)
    out[self.positions] = pages
    return out


def _subset(sizes: tuple[int, ...], target: int) -> list[int]:
  """Indices into sizes (slot_sizes' cover: powers of two 1..2^(m-1), then maybe a remainder
  rem <= 2^m) whose sizes sum to target <= sum(sizes): the remainder when target >= 2^m, then
  target's binary digits among the powers."""
  powers = {s: i for i, s in reversed(list(enumerate(sizes))) if s & (s - 1) == 0}
  rem = [i for i, s in enumerate(sizes) if i not in powers.values()]
  if target == sum(sizes):
    return list(range(len(sizes)))
  out, left = [], target
  top = 2 * max(powers, default=0)
  if rem and left >= max(top, 1):
    out.append(rem[0])
    left -= sizes[rem[0]]
  for s in sorted(powers, reverse=True):
    if s <= left:
      out.append(powers[s])
      left -= s
  if left:
    raise AssertionError(f"no slots of {sizes} sum to {target}")
  return sorted(out)


@functools.lru_cache(maxsize=4096)
def transfer_plan(buckets: tuple[int, ...], k: int) -> Plan:
  """The plan of a k-page transfer: the largest bucket b <= k, its slot 0 (b pages) and the
  cover's slots summing to k - b. buckets ascending, starting at 1."""
  if not 1 <= k <= buckets[-1]:
    raise ValueError(f"{k} exceeds the largest bucket {buckets[-1]}" if k > 0
                     else f"a transfer moves at least one page, not {k}")
  if buckets[0] != 1:
    raise ValueError(f"transfer buckets must start at 1, not {buckets}")
  b = max(size for size in buckets if size <= k)
  slots = slot_sizes(buckets, b)
  used = [0] + ([1 + i for i in _subset(slots[1:], k - slots[0])] if k > slots[0] else [])
  offsets = np.cumsum((0,) + slots)
  positions = np.concatenate([np.arange(offsets[i], offsets[i] + slots[i]) for i in used])
  return Plan(k, b, slots, tuple(used), positions.astype(np.int32))


def transfer_pieces(buckets: tuple[int, ...], k: int) -> list[int]:
  """The sizes of the pieces a k-page transfer moves (sum k; 37 -> [32, 4, 1])."""
  return transfer_plan(buckets, k).pieces
