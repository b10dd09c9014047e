"""random: a seeded uniform choice among eligible instances."""

import random

from pdjax.scheduler.policies.base import Router


class RandomRouter(Router):

  def __init__(self, seed: int = 0, **_):
    self._rng = random.Random(seed)

  def choose(self, req, candidates):
    return self._rng.choice(candidates) if candidates else None
