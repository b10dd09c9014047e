"""round_robin: cycle through the tier's instances (skipping ineligible ones)."""

from pdjax.scheduler.policies.base import Router


class RoundRobin(Router):

  def __init__(self, **_):
    self._next = 0

  def choose(self, req, candidates):
    if not candidates:
      return None
    names = sorted(w.name for w in candidates)
    pick = names[self._next % len(names)]
    self._next += 1
    return next(w for w in candidates if w.name == pick)
