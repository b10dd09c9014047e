"""least_loaded: the instance with the fewest queued prompt tokens (then fewest running
sequences, then first listed), the slice's default."""

from pdjax.scheduler.policies.base import Router


def load(w) -> tuple:
  return (w.queued_tokens(), w.num_running())


class LeastLoaded(Router):

  def __init__(self, **_):
    pass

  def choose(self, req, candidates):
    return min(candidates, key=load) if candidates else None
