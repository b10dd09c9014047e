"""least_loaded: the instance with the fewest queued prompt tokens (then fewest running
sequences; ties rotate, seeded: policies/ties.py), the slice's default."""

from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.ties import RotatingTies


def load(w) -> tuple:
  return (w.queued_tokens(), w.num_running())


class LeastLoaded(Router):

  def __init__(self, seed: int = 0, **_):
    self._ties = RotatingTies(seed)

  def choose(self, req, candidates):
    return self._ties.best(candidates, load)
