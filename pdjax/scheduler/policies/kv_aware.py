"""kv_aware: most free KV pages, then fewest active sequences, then fewest queued tokens
(ties rotate, seeded: policies/ties.py).

Queued tokens alone make a decode instance holding many long sessions look idle ("falsely
idle"): it has no queue but little KV left and a full batch. Ranking by free pages first sends
new sequences where their KV will fit and grow."""

from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.ties import RotatingTies


class KvAware(Router):

  def __init__(self, seed: int = 0, **_):
    self._ties = RotatingTies(seed)

  def choose(self, req, candidates):
    return self._ties.best(candidates, rank)


def rank(w) -> tuple:
  """Least is best: the largest free fraction of the pool, then fewest sequences and queued
  tokens."""
  return (-w.free_pages() / max(w.total_pages(), 1), w.num_running(), w.queued_tokens())
