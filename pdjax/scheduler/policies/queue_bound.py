"""queue_bound: bounded per-instance queues; a request routed to a full queue is rejected."""

from pdjax.scheduler.policies.base import AdmissionPolicy


class QueueBound(AdmissionPolicy):

  def __init__(self, max_queue: int = 32, **_):
    self.max_queue = max_queue

  def check(self, req, worker, path, decode_tier):
    if worker.num_waiting() >= self.max_queue:
      return (f"queue full: {worker.name} has {worker.num_waiting()} waiting "
              f"(scheduler.max_queue={self.max_queue})")
    return None
