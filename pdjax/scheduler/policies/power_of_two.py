"""power_of_two: sample two instances at random, keep the less loaded (queued tokens)."""

import random

from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.least_loaded import load


class PowerOfTwo(Router):

  def __init__(self, seed: int = 0, **_):
    self._rng = random.Random(seed)

  def choose(self, req, candidates):
    if len(candidates) <= 2:
      return min(candidates, key=load) if candidates else None
    return min(self._rng.sample(candidates, 2), key=load)
