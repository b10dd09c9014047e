"""power_of_two: sample two instances at random, keep the less loaded (queued tokens, then
running sequences; of two equally loaded, the one sampled first, itself random). With two
candidates or fewer there is nothing to sample: the less loaded, ties rotating (seeded:
policies/ties.py)."""

import random

from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.least_loaded import load
from pdjax.scheduler.policies.ties import RotatingTies


class PowerOfTwo(Router):

  def __init__(self, seed: int = 0, **_):
    self._rng = random.Random(seed)
    self._ties = RotatingTies(seed)

  def choose(self, req, candidates):
    if len(candidates) <= 2:
      return self._ties.best(candidates, load)
    return min(self._rng.sample(candidates, 2), key=load)
