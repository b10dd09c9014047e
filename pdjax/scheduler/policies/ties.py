"""Tie-breaking for routers: among the candidates ranked equally best, the routers rotate.

Breaking ties by candidate order sends every request to the first instance whenever the tier
is equally loaded (an idle tier, most of a lightly loaded run: 62 of 64 prefills went to
prefill-0). `RotatingTies.best` keeps a position in the candidate list, drawn from the seed at
first and moved past each pick: a tie goes to the first tied candidate at or after it
(cyclically), so equally loaded instances take turns, in the same order for the same seed."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

START_RANGE = 1 << 16   # the first position is drawn from [0, START_RANGE), used mod len


class RotatingTies:

  def __init__(self, seed: int):
    self._position = random.Random(seed).randrange(START_RANGE)

  def best(self, candidates: Sequence, rank: Callable):
    """The candidate of least rank(candidate), ties rotating (see the module); None when there
    are no candidates."""
    if not candidates:
      return None
    ranks = [rank(w) for w in candidates]
    low = min(ranks)
    n = len(candidates)
    start = self._position % n
    for k in range(n):
      i = (start + k) % n
      if ranks[i] == low:
        self._position = i + 1
        return candidates[i]
    raise AssertionError(f"no candidate ranks {low!r}, the least of {ranks!r}")
