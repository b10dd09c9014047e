"""kv_aware: most free KV pages, then fewest active sequences.

Queued tokens alone make a decode instance holding many long sessions look idle ("falsely
idle"): it has no queue but little KV left and a full batch. Ranking by free pages first sends
new sequences where their KV will fit and grow."""

from pdjax.scheduler.policies.base import Router


class KvAware(Router):

  def __init__(self, **_):
    pass

  def choose(self, req, candidates):
    if not candidates:
      return None
    return min(candidates, key=lambda w: (-w.free_pages() / max(w.total_pages(), 1),
                                          w.num_running(), w.queued_tokens()))
